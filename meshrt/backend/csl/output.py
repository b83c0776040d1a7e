"""What the CSL backend emits: files by relative path, the allocation report."""

from __future__ import annotations

from dataclasses import dataclass, field

FILE_MARK = "// ----- FILE: "


@dataclass
class CslOutput:
    files: dict[str, str] = field(default_factory=dict)  # relative path -> text
    arrays: dict[str, object] = field(default_factory=dict)  # relative path -> numpy array (.npy)
    # core class -> its resident regions: (kernel, array, offset, elements)
    regions: dict[str, list[tuple[str, str, int, int]]] = field(default_factory=dict)
    report: str = ""
    table: list[str] = field(default_factory=list)

    def as_text(self) -> str:
        """All files, each behind a `// ----- FILE: <name>` line."""
        parts = []
        for name, text in self.files.items():
            parts.append(f"{FILE_MARK}{name}\n{text}")
        return "".join(parts)
