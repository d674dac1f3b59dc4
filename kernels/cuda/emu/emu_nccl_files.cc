/* The files the emulated NCCL's ranks exchange through (emu_nccl.h), and whether a peer lives. */
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "emu_nccl.h"

namespace zt_emu_nccl {

bool process_gone(pid_t pid) {
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return true;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return true;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')');
    return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

bool write_whole(const std::string &path, const file_head &h, const void *data, size_t bytes,
                 std::string &why) {
    std::string tmp = path + ".tmp";
    int fd = open(tmp.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
    bool ok = fd >= 0 && write(fd, &h, sizeof h) == (ssize_t)sizeof h;
    for (size_t at = 0; ok && at < bytes;) {
        ssize_t w = write(fd, (const char *)data + at, bytes - at);
        ok = w > 0;
        at += ok ? (size_t)w : 0;
    }
    if (fd >= 0)
        ok = close(fd) == 0 && ok;
    ok = ok && rename(tmp.c_str(), path.c_str()) == 0;
    if (!ok)
        why = "cannot write " + path + ": " + strerror(errno);
    return ok;
}

bool read_whole(const std::string &path, std::vector<char> &out) {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    struct stat st;
    bool ok = fstat(fd, &st) == 0;
    out.resize(ok ? (size_t)st.st_size : 0);
    for (size_t at = 0; ok && at < out.size();) {
        ssize_t r = read(fd, out.data() + at, out.size() - at);
        ok = r > 0;
        at += ok ? (size_t)r : 0;
    }
    close(fd);
    return ok;
}

void remove_files(const std::string &prefix) {
    std::string base = prefix.substr(strlen(kDir)) + "-";
    DIR *d = opendir(kDir);
    if (!d)
        return;
    while (struct dirent *e = readdir(d))
        if (strncmp(e->d_name, base.c_str(), base.size()) == 0)
            unlink((std::string(kDir) + e->d_name).c_str());
    closedir(d);
}

} // namespace zt_emu_nccl
