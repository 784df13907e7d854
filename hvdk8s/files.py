"""Reading the files users name (job specs, pipelines, TF Serving's config files): errors that say which file."""
from __future__ import annotations

import os
from pathlib import Path


def read_text(path: str | os.PathLike[str], source: str) -> str:
    """The file's UTF-8 text; ``source`` is how messages name it (its path, or ``--flag PATH``).

    A missing file is ``FileNotFoundError``; a directory, an unreadable file
    or one that is not UTF-8 text is ``ValueError``. Each message starts with
    ``source`` and says which, never a traceback from the decoder.
    """
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"{source}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"{source}: is a directory, not a file") from None
    except OSError as err:
        raise ValueError(f"{source}: cannot read: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{source}: not UTF-8 text (byte {err.start})") from None
