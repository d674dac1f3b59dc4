/* The dashboard's files (http_internal.h): /, /static/ and /vendor/chart.js/ are answered from
 * a directory on disk, with only plain relative paths accepted, so that no request can read
 * outside it. */
#define _GNU_SOURCE
#include <ctype.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "http_internal.h"

/* A relative path of plain names: [A-Za-z0-9._-] segments separated by single slashes, none
 * starting with '.', so neither ".." nor hidden files can be reached. */
static bool safe_rel_path(const char *p) {
    size_t n = strlen(p);
    if (n == 0 || n > 200)
        return false;
    bool seg_start = true;
    for (size_t i = 0; i < n; i++) {
        char ch = p[i];
        if (ch == '/') {
            if (seg_start)
                return false;
            seg_start = true;
            continue;
        }
        if (seg_start && ch == '.')
            return false;
        if (!isalnum((unsigned char)ch) && ch != '.' && ch != '_' && ch != '-')
            return false;
        seg_start = false;
    }
    return !seg_start;
}

static const char *content_type(const char *path) {
    static const struct { const char *ext, *type; } types[] = {
        {".html", "text/html; charset=utf-8"},   {".js", "text/javascript; charset=utf-8"},
        {".mjs", "text/javascript; charset=utf-8"}, {".css", "text/css; charset=utf-8"},
        {".json", "application/json"},           {".map", "application/json"},
        {".svg", "image/svg+xml"},               {".png", "image/png"},
        {".ico", "image/x-icon"},                {".txt", "text/plain; charset=utf-8"},
        {".woff2", "font/woff2"},
    };
    const char *dot = strrchr(path, '.');
    for (size_t i = 0; dot && i < sizeof types / sizeof types[0]; i++)
        if (strcmp(dot, types[i].ext) == 0)
            return types[i].type;
    return "application/octet-stream";
}

/* What the dashboard's pages may do, whatever a job's name, log line or metric holds: run only
 * its own scripts, talk only to this server, and never be framed by another site's page (where
 * a transparent frame would take the clicks meant for it, "Cancel" included). Inline styles stay
 * allowed: Chart.js sizes its canvases with them. */
static const char dashboard_csp[] =
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'";

enum MHD_Result zt_http_serve_file(struct MHD_Connection *c, const char *dir, const char *rel,
                                   const char *cache) {
    char path[PATH_MAX];
    if (!dir || !safe_rel_path(rel) ||
        snprintf(path, sizeof path, "%s/%s", dir, rel) >= (int)sizeof path)
        return zt_http_send_error(c, MHD_HTTP_NOT_FOUND, "no such file");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        if (fd >= 0)
            close(fd);
        return zt_http_send_error(c, MHD_HTTP_NOT_FOUND, "no such file: %s", rel);
    }
    /* MHD owns the descriptor from here, and closes it. */
    struct MHD_Response *r = MHD_create_response_from_fd((uint64_t)sb.st_size, fd);
    if (!r) {
        close(fd);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type(rel));
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, cache);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Content-Security-Policy", dashboard_csp);
    MHD_add_response_header(r, "X-Frame-Options", "DENY");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    return zt_http_queue(c, MHD_HTTP_OK, r);
}
