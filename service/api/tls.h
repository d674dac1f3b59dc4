/* TLS material for ztraind's servers (gRPC and HTTP) and for the CLI's gRPC client: PEM files
 * read and checked before anything listens or connects, so that a wrong path, a file that holds
 * no certificate, or a key that is not the certificate's is one message naming the flag and the
 * file, and not a handshake that fails later for every client. */
#ifndef ZTRAIN_TLS_H
#define ZTRAIN_TLS_H

#include "ztrain/status.h"

/* One PEM file and how the user names it, for messages: the flag ("--tls-cert") or the
 * environment variable ("ZTRAIN_TLS_CERT"). A NULL or empty path means "not given"; its source
 * still names what is missing when its partner was given. */
typedef struct {
    const char *path;
    const char *source;
} zt_tls_file;

/* The files' contents, NUL-terminated PEM text owned by the struct (zt_tls_pem_free). */
typedef struct {
    char *cert;   /* a certificate chain, the leaf first; NULL when none was given */
    char *key;    /* the leaf's private key, unencrypted; NULL exactly when cert is */
    char *ca;     /* CA certificates to trust: a server verifies client certificates with them,
                     a client the server's; NULL when none was given */
} zt_tls_pem;

/* Reads and checks the files that were given. cert and key come together or not at all
 * (ZT_ERR_INVALID naming the one that is missing). Each file must hold what it is for: at
 * least one PEM certificate (cert, ca) or a PEM private key that this build can read without
 * a passphrase (key), else ZT_ERR_FORMAT naming its source and path; an unreadable file is
 * ZT_ERR_IO, "--tls-cert /path: cannot open: No such file or directory". A key that does not
 * belong to the certificate is ZT_ERR_INVALID naming both. On failure *out is left empty. */
zt_status zt_tls_load(zt_tls_pem *out, zt_tls_file cert, zt_tls_file key, zt_tls_file ca);

/* Frees what zt_tls_load read (the key's bytes are cleared first) and empties *p; an empty or
 * zeroed struct is fine. */
void zt_tls_pem_free(zt_tls_pem *p);

#endif
