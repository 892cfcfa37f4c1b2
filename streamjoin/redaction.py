"""Keeps an app's secrets out of its log lines, whoever writes them.

Settings hold credentials as :class:`~streamjoin.config.Secret`, so streamjoin never
formats one; but the libraries below it log what they send at DEBUG (aiokafka logs every
request, a SASL/PLAIN authentication included). :class:`SecretsFilter`, on the log's
handlers, masks every known secret value in a record's message, arguments and traceback
before it is written. ``streamjoin worker`` installs it with the app's secrets
(``AppConfig.secret_values()``); an embedded app can call :func:`mask_secrets_in_logs`.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Iterable

__all__ = ["MASK", "SecretsFilter", "mask_secrets_in_logs"]

#: what a secret becomes in a log line
MASK = "**********"


def _forms(secret: str) -> set[str]:
    """How ``secret`` can appear in text: as is, escaped in a str or bytes repr, or
    percent-encoded in a URL."""
    return {
        secret,
        repr(secret)[1:-1],
        repr(secret.encode("utf-8"))[2:-1],
        urllib.parse.quote(secret, safe=""),
    }


class SecretsFilter(logging.Filter):
    """Masks ``secrets`` in every record it sees (on a handler: every line it writes)."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        forms = {form for secret in secrets if secret for form in _forms(secret)}
        #: longest first: a secret containing another is masked whole
        self._forms = sorted(forms, key=len, reverse=True)

    def mask(self, text: str) -> str:
        for form in self._forms:
            if form in text:
                text = text.replace(form, MASK)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._forms:
            return True
        try:
            message = record.getMessage()
        except Exception:  # a bad format: the handler reports it as it always does
            return True
        masked = self.mask(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.mask(record.exc_text)
        if record.stack_info:
            record.stack_info = self.mask(record.stack_info)
        return True


def mask_secrets_in_logs(
    secrets: Iterable[str], handlers: Iterable[logging.Handler] | None = None
) -> SecretsFilter:
    """Install a :class:`SecretsFilter` of ``secrets`` on ``handlers`` (default: the root
    logger's, where every logger's records end up); returns it (``removeFilter`` undoes)."""
    mask = SecretsFilter(secrets)
    for handler in logging.getLogger().handlers if handlers is None else handlers:
        handler.addFilter(mask)
    return mask
