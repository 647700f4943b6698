"""Each result file's no-draft decode against its bandwidth limit from the bytes a decode step
reads (benchmarks/harness/limits.py): for reports written before the bench counted those, the
limit they held beside the corrected one.

    python benchmarks/step_limits.py benchmarks/results/h200_8b_plain_final_session17.json ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness.limits import step_bytes, step_limit_tok_s  # noqa: E402


def main(files: list[str]) -> int:
    if not files:
        print("usage: python benchmarks/step_limits.py RESULT.json ...", file=sys.stderr)
        return 2
    print("| file | model | decode tok/s | limit held | limit (bytes a step reads) | of it |")
    print("|---|---|---|---|---|---|")
    for name in files:
        try:
            report = json.loads(Path(name).read_text())
            tok = (report.get("no_draft") or report["plain"])["decode_tok_s"]
            limit = step_limit_tok_s(report)
        except (OSError, ValueError, KeyError) as e:
            print(f"{name}: {e}", file=sys.stderr)
            return 1
        print(f"| `{Path(name).name}` | {report['model']} | {tok:.1f} | {report['bandwidth_limit_tok_s']:.1f} | "
              f"{limit:.1f} ({step_bytes(report) / 1e9:.3f} GB) | {tok / limit * 100:.1f}% |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
