"""Whether a server answers, found out in seconds: the W&B and Hugging Face Hub checks ask before their
clients would retry for minutes."""

from __future__ import annotations


def answers(url: str, timeout_s: float) -> bool:
    """Whether an HTTP(S) server at `url` answers at all (any status) within the timeout."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(url, timeout=timeout_s).close()
    except urllib.error.HTTPError:
        return True  # it answered, if only with an error status
    except (OSError, ValueError):
        return False
    return True
