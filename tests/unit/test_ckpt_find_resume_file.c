/* A checkpoint_dir that is a file, with resume on: zt_ckpt_find_resume fails with the error the
 * first save would give ("exists and is not a directory") and writes no notice, so a run does not
 * first announce that it starts from step 0. A directory that does not exist still gets that
 * notice and no error. */
#include "check.h"
#include "ztrain/checkpoint.h"

int main(void) {
    check_tmpdir_create("zt_find_resume_file");
    const char *file = check_tmp_path("ckpt");
    check_write_file(file, "x", 1);
    char tag[256], note[4096];
    zt_status s = zt_ckpt_find_resume(file, tag, sizeof tag, note, sizeof note);
    CHECK(s == ZT_ERR_IO, "status %d for a file", (int)s);
    CHECK(strstr(zt_last_error(), "exists and is not a directory") &&
              strstr(zt_last_error(), file),
          "error '%s'", zt_last_error());
    CHECK(note[0] == '\0' && tag[0] == '\0', "notice '%s', tag '%s'", note, tag);

    const char *missing = check_tmp_path("none");
    s = zt_ckpt_find_resume(missing, tag, sizeof tag, note, sizeof note);
    CHECK(s == ZT_OK && tag[0] == '\0', "status %d for a missing directory", (int)s);
    CHECK(strstr(note, "starting from step 0") != NULL, "notice '%s'", note);
    check_tmpdir_remove();
    return check_summary("test_ckpt_find_resume_file");
}
