"""TF Serving's config files: protobuf text format, parsed strictly (unknown fields and bad syntax name the line)."""
from __future__ import annotations

import os
from typing import TypeVar

from google.protobuf import text_format
from google.protobuf.message import Message

from hvdk8s.common import files

M = TypeVar("M", bound=Message)


def parse(text: str, message: M, source: str, what: str | None = None) -> M:
    """``text`` parsed into ``message``; a ``ValueError`` starting with ``source`` (and, given ``what``, the
    message type as TF Serving words it: ``Error parsing text-format <what>``) when it does not parse."""
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as err:
        prefix = f"Error parsing text-format {what}: " if what else ""
        raise ValueError(f"{source}: {prefix}{err}") from None
    return message


def read(path: str | os.PathLike[str], flag: str) -> tuple[str, str]:
    """The text of the file a flag names, and the source its errors name (``--flag PATH``); a file that is
    missing, unreadable or not UTF-8 text (protobuf's text format is) raises as ``hvdk8s.common.files.read_text``."""
    source = f"{flag} {path}"
    return files.read_text(path, source), source
