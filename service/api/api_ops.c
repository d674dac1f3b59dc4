/* The scope each API operation needs, for both transports (api_ops.h). */
#include "api_ops.h"

static const zt_scope needs[ZT_OP_COUNT] = {
    [ZT_OP_OTHER] = ZT_SCOPE_ADMIN,
    [ZT_OP_SUBMIT] = ZT_SCOPE_SUBMIT,
    [ZT_OP_CANCEL] = ZT_SCOPE_SUBMIT,
    [ZT_OP_GET] = ZT_SCOPE_READ,
    [ZT_OP_LIST] = ZT_SCOPE_READ,
    [ZT_OP_WATCH] = ZT_SCOPE_READ,
    [ZT_OP_METRICS] = ZT_SCOPE_READ,
    [ZT_OP_RECORDS] = ZT_SCOPE_READ,
    [ZT_OP_LOGS] = ZT_SCOPE_READ,
    [ZT_OP_CHECKPOINTS] = ZT_SCOPE_READ,
    [ZT_OP_EFFECTIVE_CONFIG] = ZT_SCOPE_READ,
    [ZT_OP_ANOMALIES] = ZT_SCOPE_READ,
    [ZT_OP_DELIVERIES] = ZT_SCOPE_READ,
    [ZT_OP_EXPORT] = ZT_SCOPE_READ,
    [ZT_OP_PROMETHEUS] = ZT_SCOPE_READ,
    [ZT_OP_API_DOC] = ZT_SCOPE_READ,
    [ZT_OP_HEALTH] = ZT_SCOPE_READ,
};

zt_scope zt_api_op_scope(zt_api_op op) {
    /* An entry left out of the table (ZT_SCOPE_NONE) is admin's, as is an unknown op. */
    if ((int)op < 0 || op >= ZT_OP_COUNT || needs[op] == ZT_SCOPE_NONE)
        return ZT_SCOPE_ADMIN;
    return needs[op];
}
