#!/bin/sh
# Example infermesh `exec` health check: passes iff the probe got outputs and
# none of their values is NaN or infinite (written as null in the document).
#
#   [[health.checks]]
#   kind = "exec"
#   model = "dense"
#   command = "health/check-output.sh"     # relative to the config file's directory
#   timeout = "5s"
#
# stdin: {"model": ..., "request": {"inputs": [...]},
#         "response": {"outputs": [{"name", "datatype", "shape", "data"}]},
#         "latency_ms": ...}
#        with "error": "..." instead of "response" when the probe failed.
# Exit 0 = pass, anything else = fail; the first line printed is the reason.
exec python3 -c '
import json, sys

doc = json.load(sys.stdin)
if "error" in doc:
    print("probe failed: " + doc["error"])
    sys.exit(1)
outputs = doc.get("response", {}).get("outputs", [])
if not outputs:
    print("the response has no outputs")
    sys.exit(1)
for out in outputs:
    bad = sum(1 for v in out["data"] if v is None)
    if bad:
        print("%s: %d of %d values are not finite" % (out["name"], bad, len(out["data"])))
        sys.exit(1)
print("%d outputs look sane (%.2f ms)" % (len(outputs), doc["latency_ms"]))
'
