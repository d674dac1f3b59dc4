/* GET /api/v1/openapi.json (http_internal.h): the OpenAPI 3.1 document of this HTTP API,
 * service/http/openapi.json as it was when ztraind was built (service/CMakeLists.txt embeds it),
 * so that the document served is always the one of the routes served. */
#include <stdlib.h>
#include <string.h>

#include "http_internal.h"

extern const unsigned char zt_openapi_json[];
extern const size_t zt_openapi_json_size;

enum MHD_Result zt_http_openapi(zt_http_server *s, struct MHD_Connection *c) {
    (void)s;
    struct MHD_Response *r = MHD_create_response_from_buffer(
        zt_openapi_json_size, (void *)zt_openapi_json, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    return zt_http_queue(c, MHD_HTTP_OK, r);
}
