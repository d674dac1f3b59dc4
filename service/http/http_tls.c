/* HTTPS for ztraind's HTTP server (http_internal.h): the libmicrohttpd options that serve the
 * TLS certificate, and under mutual TLS the check that a request's connection presented a
 * client certificate one of the trusted CAs signed. */
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

#include "http_internal.h"

zt_status zt_http_tls_options(zt_http_server *s, const zt_tls_pem *tls,
                              struct MHD_OptionItem opts[ZT_HTTP_TLS_OPTIONS], unsigned *flags) {
    size_t n = 0;
    *flags = 0;
    if (tls && tls->cert) {
        if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)
            return zt_error(ZT_ERR_UNSUPPORTED, "HTTP: this libmicrohttpd was built without TLS, "
                            "so --tls-cert cannot be served over HTTPS");
        *flags = MHD_USE_TLS;
        opts[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, tls->cert};
        opts[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, tls->key};
        /* MHD only asks for a client certificate when it has a trust list, and accepts a
         * connection without one: zt_http_guard_client_cert decides. */
        if (tls->ca)
            opts[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_TRUST, 0, tls->ca};
        s->client_certs = tls->ca != NULL;
    }
    opts[n] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
    return ZT_OK;
}

bool zt_http_guard_client_cert(const zt_http_server *s, struct MHD_Connection *c,
                               enum MHD_Result *ret) {
    if (!s->client_certs)
        return true;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    gnutls_session_t session = ci ? ci->tls_session : NULL;
    /* The certificate must chain to the trust list and, when it names its purposes, be meant
     * for TLS clients: what gRPC's OpenSSL asks of the same certificate. */
    gnutls_typed_vdata_st purpose = {.type = GNUTLS_DT_KEY_PURPOSE_OID,
                                     .data = (unsigned char *)GNUTLS_KP_TLS_WWW_CLIENT};
    unsigned status = 0;
    int rc = session ? gnutls_certificate_verify_peers(session, &purpose, 1, &status)
                     : GNUTLS_E_INVALID_SESSION;
    if (rc == 0 && status == 0)
        return true;
    if (rc == GNUTLS_E_NO_CERTIFICATE_FOUND) {
        *ret = zt_http_send_refusal(c, MHD_HTTP_FORBIDDEN, "CLIENT_CERTIFICATE_MISSING",
                                    "this server needs a TLS client certificate signed by a "
                                    "CA of ztraind --tls-client-ca, and none was presented");
        return false;
    }
    gnutls_datum_t why = {0};
    if (rc == 0 &&
        gnutls_certificate_verification_status_print(status, GNUTLS_CRT_X509, &why, 0) == 0)
        while (why.size > 0 && why.data[why.size - 1] == ' ')
            why.data[--why.size] = '\0';
    *ret = zt_http_send_refusal(c, MHD_HTTP_FORBIDDEN, "CLIENT_CERTIFICATE_REFUSED",
                                "the TLS client certificate was refused: %s",
                                rc == 0 && why.data ? (const char *)why.data
                                                    : gnutls_strerror(rc));
    gnutls_free(why.data);
    return false;
}
