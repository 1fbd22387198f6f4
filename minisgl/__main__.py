"""`python -m minisgl`: serve the OpenAI-compatible API, or chat in the terminal with --shell."""

from __future__ import annotations

import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    # each mode imports its own modules once the flags chose it: `--shell` never loads the HTTP
    # stack (FastAPI, uvicorn)
    from minisgl.server.args import parse_args
    from minisgl.server.launch import LaunchError

    args = parse_args(argv)
    try:
        if args.server.shell:
            from minisgl.server.shell import run_shell

            run_shell(args)
        else:
            from minisgl.server.drain import serve

            serve(args)
    except LaunchError as e:
        print(f"minisgl: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
