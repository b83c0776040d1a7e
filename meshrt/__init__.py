"""meshrt: compile-time governance of runtime dynamism for LLM inference on wafer-scale meshes."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("meshrt")
except PackageNotFoundError:  # a source checkout that was never pip-installed
    __version__ = "0+unknown"

del PackageNotFoundError, version
