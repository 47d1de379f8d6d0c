"""``python -m fastpath``: the command-line interface (exit 2: bad usage, 1: cannot run).
The flags are the rows of ``fastpath.options.OPTIONS``."""
import sys

from .errors import ConfigurationError, FastpathError
from ._lifecycle import serve
from .options import Options, build_parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        serve(Options(**vars(args)))
    except ConfigurationError as exc:
        parser.error(str(exc))
    except FastpathError as exc:
        print(f"fastpath: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
