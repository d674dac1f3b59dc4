"""Runs schemathesis's command line (its arguments are this program's) with one adaptation to
the test venv: schemathesis 4 reads an event stream with urllib3 2's HTTPResponse.read1, and the
venv sees Debian's urllib3 1.26, which has no read1. The stand-in reads what one read of the
socket gives (urllib3 1.26's read with its own buffering switched off: at most amt bytes, fewer
when the stream has fewer now), which is read1's contract; nothing else is changed."""
import sys

import urllib3.response

if not hasattr(urllib3.response.HTTPResponse, "read1"):
    def read1(self, amt=None, decode_content=None):
        # One recv of the underlying file object, decoded as read() would.
        fp = self._fp
        if fp is None:
            return b""
        data = fp.read1(amt if amt and amt > 0 else 65536) if hasattr(fp, "read1") else \
            fp.read(amt)
        if not data:
            return b""
        return self._decode(data, decode_content if decode_content is not None
                            else self.decode_content, flush_decoder=False)

    urllib3.response.HTTPResponse.read1 = read1

from schemathesis.cli import schemathesis  # noqa: E402

sys.exit(schemathesis())
