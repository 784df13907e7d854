"""TF Serving's config files: protobuf text format, parsed strictly (unknown fields and bad syntax name the line)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

from google.protobuf import text_format
from google.protobuf.message import Message

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
    """The text of the file a flag names, and the source its errors name (``--flag PATH``).

    A missing file is ``FileNotFoundError``; one that cannot be read or is
    not UTF-8 text (protobuf's text format is) a ``ValueError``: each says
    which flag and file.
    """
    source = f"{flag} {path}"
    try:
        return Path(path).read_text(encoding="utf-8"), source
    except FileNotFoundError:
        raise FileNotFoundError(f"{source}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"{source}: is a directory, not a file") from None
    except OSError as err:
        raise ValueError(f"{source}: cannot read: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{source}: not UTF-8 text (byte {err.start})") from None
