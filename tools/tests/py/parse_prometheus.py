"""Parses Prometheus text (stdin) with the reference parser of the
`prometheus_client` package and prints the families as JSON (stdout).
A text the parser rejects exits 1 with its error on stderr."""
import json
import sys

from prometheus_client.parser import text_string_to_metric_families

try:
    families = [
        {
            "name": f.name,
            "type": f.type,
            "help": f.documentation,
            "samples": [
                {"name": s.name, "labels": s.labels, "value": repr(float(s.value))}
                for s in f.samples
            ],
        }
        for f in text_string_to_metric_families(sys.stdin.read())
    ]
except Exception as e:  # the parser raises ValueError and friends
    sys.exit(f"prometheus_client rejected the text: {type(e).__name__}: {e}")
json.dump(families, sys.stdout)
