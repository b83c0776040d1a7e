"""`meshrt-opt`: xdsl-opt with meshrt's dialects, passes and targets.

Differences from plain xdsl-opt, all about diagnostics: every parse or
verification failure, inside a pass or not, is one located line
(`FILE:LINE:COL: error: ...`) on stderr and exit code 1, never a Python
traceback; under `--verify-diagnostics` the same line goes to stdout and the
run continues with the next `// -----` chunk, so FileCheck can pin it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import IO

from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass, PassPipeline
from xdsl.utils.exceptions import ArgSpecParseError, DiagnosticException, ParseError
from xdsl.xdsl_opt_main import xDSLOptMain

from meshrt.diagnostics import MeshrtError, parse_module, verify_located
from meshrt.output import output_stream


class MeshrtOptMain(xDSLOptMain):
    version_format = "meshrt-opt built on xdsl {xdsl_version}"

    def __init__(self, args: Sequence[str] | None = None):
        super().__init__(description="meshrt modular optimizer driver", args=args)

    def register_all_dialects(self):
        super().register_all_dialects()
        # Also usable from a source checkout whose entry point is not installed.
        from meshrt.dialects import get_all_dialects

        for name, factory in get_all_dialects().items():
            if name not in self.ctx.registered_dialect_names:
                self.ctx.register_dialect(name, factory)

    def register_all_passes(self):
        super().register_all_passes()
        from meshrt.passes import get_all_passes

        for name, factory in get_all_passes().items():
            self.available_passes.setdefault(name, factory)

    def register_all_targets(self):
        super().register_all_targets()
        from meshrt.backend.targets import get_all_targets

        for name, factory in get_all_targets().items():
            self.available_targets.setdefault(name, factory)
        # `-t csl` means meshrt's CSL emitter here, where no clash can occur.
        if "meshrt-csl" in self.available_targets:
            self.available_targets["csl"] = self.available_targets["meshrt-csl"]

    def setup_pipeline(self):
        def verify_between(
            previous: ModulePass | None, module: ModuleOp, _next: ModulePass | None
        ) -> None:
            if not self.args.disable_verify:
                verify_located(module, self.get_input_name())
            if previous is not None and _next is not None and self.args.print_between_passes:
                print(f"// -----// IR after {previous.name} //----- //")
                print(module)

        self.pipeline = PassPipeline.parse_spec(
            self.available_passes, self.args.passes, verify_between
        )

    def run(self):
        # -o is written atomically: replaced only when every chunk went through
        with output_stream(self.args.output_file) as self._output:
            super().run()

    def prepare_output(self) -> IO[str]:
        return self._output

    def parse_chunk(self, chunk: IO[bytes], file_extension: str, start_offset: int = 0):
        if file_extension != "mlir" and file_extension in self.available_frontends:
            return self.available_frontends[file_extension](chunk)
        return parse_module(self.ctx, chunk.read(), self.get_input_name(), start_offset)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        tool = MeshrtOptMain(args=argv)
        tool.run()
    except MeshrtError as e:
        print(str(e), file=sys.stderr)
        return 1
    except ParseError as e:
        from meshrt.diagnostics import format_parse_error

        print(format_parse_error(e, e.span.input.name), file=sys.stderr)
        return 1
    except DiagnosticException as e:
        print(f"meshrt-opt: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    except ArgSpecParseError as e:
        print(f"meshrt-opt: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print(f"meshrt-opt: error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # a bug in meshrt: still one line, unless asked for more
        if os.environ.get("MESHRT_TRACEBACK"):
            raise
        print(f"meshrt-opt: internal error: {type(e).__name__}: {e} "
              "(set MESHRT_TRACEBACK=1 for details)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
