"""What the CSL backend emits: files by relative path, the allocation report."""

from __future__ import annotations

from dataclasses import dataclass, field

FILE_MARK = "// ----- FILE: "


@dataclass
class CslOutput:
    files: dict[str, str] = field(default_factory=dict)  # relative path -> text
    report: str = ""
    table: list[str] = field(default_factory=list)

    def as_text(self) -> str:
        """All files, each behind a `// ----- FILE: <name>` line."""
        parts = []
        for name, text in self.files.items():
            parts.append(f"{FILE_MARK}{name}\n{text}")
        return "".join(parts)
