"""The error kinds a user can fix, which every entry point turns into exit 2 (`common.exit_codes`).

A leaf module: the low-level writers (`common.atomic_write`, `common.run_lock`) raise them without
importing the config machinery, which itself writes through `common.atomic_write`."""


class ConfigError(ValueError):
    """A config problem a user can fix: the message names the key, the source and a suggestion."""


class OutputPathError(ConfigError):
    """An output location that cannot be used, with the reason and what to do (exit 2)."""
