/* Reading and checking TLS certificates and keys (tls.h). GnuTLS parses them: it is what
 * libmicrohttpd serves HTTPS with, so a pair it accepts here is one the HTTP server can load,
 * and gRPC (OpenSSL) reads the same PEM forms. */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

#include "ztrain/fsutil.h"
#include "tls.h"

static bool given(zt_tls_file f) {
    return f.path && f.path[0];
}

/* The file's text. PEM is text: a NUL inside would make gRPC, which takes C strings, see
 * less than GnuTLS does. */
static zt_status read_pem(zt_tls_file f, char **out, size_t *len) {
    zt_status s = zt_read_file(f.path, out, len);
    if (s != ZT_OK)
        return zt_error_prefix(s, "%s ", f.source);
    if (strlen(*out) != *len) {
        free(*out);
        *out = NULL;
        return zt_error(ZT_ERR_FORMAT, "%s %s: a PEM file cannot hold a NUL byte", f.source,
                        f.path);
    }
    return ZT_OK;
}

static gnutls_datum_t datum(const char *text, size_t len) {
    return (gnutls_datum_t){.data = (unsigned char *)text, .size = (unsigned)len};
}

/* At least one PEM certificate in text. */
static zt_status check_certs(zt_tls_file f, const char *text, size_t len) {
    gnutls_datum_t d = datum(text, len);
    gnutls_x509_crt_t *certs = NULL;
    unsigned n = 0;
    int rc = gnutls_x509_crt_list_import2(&certs, &n, &d, GNUTLS_X509_FMT_PEM, 0);
    for (unsigned i = 0; i < n; i++)
        gnutls_x509_crt_deinit(certs[i]);
    gnutls_free(certs);
    if (rc < 0 || n == 0)
        return zt_error(ZT_ERR_FORMAT, "%s %s: no PEM certificate could be read from it (%s)",
                        f.source, f.path, rc < 0 ? gnutls_strerror(rc) : "none found");
    return ZT_OK;
}

static zt_status check_key(zt_tls_file f, const char *text, size_t len) {
    if (!strstr(text, "PRIVATE KEY-----"))
        return zt_error(ZT_ERR_FORMAT, "%s %s: no PEM private key in it", f.source, f.path);
    gnutls_x509_privkey_t key;
    if (gnutls_x509_privkey_init(&key) < 0)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    gnutls_datum_t d = datum(text, len);
    int rc = gnutls_x509_privkey_import2(key, &d, GNUTLS_X509_FMT_PEM, NULL, 0);
    gnutls_x509_privkey_deinit(key);
    if (rc < 0)
        return zt_error(ZT_ERR_FORMAT, "%s %s: the private key cannot be read (%s); ztraind "
                        "takes an unencrypted one (`openssl pkey -in KEY -out NEW` decrypts it)",
                        f.source, f.path, gnutls_strerror(rc));
    return ZT_OK;
}

/* Whether the key is the one the leaf certificate was issued for: GnuTLS checks exactly that
 * when it takes the pair as a server's credentials. */
static zt_status check_pair(zt_tls_file cf, const zt_tls_pem *p, size_t cert_len, zt_tls_file kf,
                            size_t key_len) {
    gnutls_certificate_credentials_t cred;
    if (gnutls_certificate_allocate_credentials(&cred) < 0)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    gnutls_datum_t c = datum(p->cert, cert_len), k = datum(p->key, key_len);
    int rc = gnutls_certificate_set_x509_key_mem2(cred, &c, &k, GNUTLS_X509_FMT_PEM, NULL, 0);
    gnutls_certificate_free_credentials(cred);
    if (rc == GNUTLS_E_CERTIFICATE_KEY_MISMATCH)
        return zt_error(ZT_ERR_INVALID, "%s %s is not the private key of the certificate in %s "
                        "%s", kf.source, kf.path, cf.source, cf.path);
    if (rc < 0)
        return zt_error(ZT_ERR_INVALID, "%s %s with %s %s: the pair cannot be used (%s)",
                        cf.source, cf.path, kf.source, kf.path, gnutls_strerror(rc));
    return ZT_OK;
}

static zt_status load(zt_tls_pem *p, zt_tls_file cert, zt_tls_file key, zt_tls_file ca) {
    size_t n_cert = 0, n_key = 0, n_ca = 0;
    if (given(cert)) {
        ZT_TRY(read_pem(cert, &p->cert, &n_cert));
        ZT_TRY(check_certs(cert, p->cert, n_cert));
        ZT_TRY(read_pem(key, &p->key, &n_key));
        ZT_TRY(check_key(key, p->key, n_key));
        ZT_TRY(check_pair(cert, p, n_cert, key, n_key));
    }
    if (given(ca)) {
        ZT_TRY(read_pem(ca, &p->ca, &n_ca));
        ZT_TRY(check_certs(ca, p->ca, n_ca));
    }
    return ZT_OK;
}

zt_status zt_tls_load(zt_tls_pem *out, zt_tls_file cert, zt_tls_file key, zt_tls_file ca) {
    *out = (zt_tls_pem){0};
    if (given(cert) != given(key)) {
        zt_tls_file has = given(cert) ? cert : key, lacks = given(cert) ? key : cert;
        return zt_error(ZT_ERR_INVALID, "%s %s needs %s too: a certificate and its private key "
                        "come together", has.source, has.path, lacks.source);
    }
    zt_status s = load(out, cert, key, ca);
    if (s != ZT_OK)
        zt_tls_pem_free(out);
    return s;
}

void zt_tls_pem_free(zt_tls_pem *p) {
    if (p->key)
        explicit_bzero(p->key, strlen(p->key));
    free(p->cert);
    free(p->key);
    free(p->ca);
    *p = (zt_tls_pem){0};
}
