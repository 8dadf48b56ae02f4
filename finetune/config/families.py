"""The one rule for the flags that only some task families read: a flag set (away from its default, or
to a value that asks for its path) under a --task_type that does not read it is refused in one line
naming the flag and --task_type, before anything loads. Accepted, it would change nothing but the run's
identity and card, and the user would believe it honoured.

Each family declares its own flags (finetune/families/<family>/flags.py `OWNED`, gathered by the seam as
`FLAG_OWNERS`): which families read each, and whether it is in the run's identity (config/identity.py);
a flag none declares is every family's."""

from __future__ import annotations

from dataclasses import dataclass

from finetune.errors import ConfigError

ABSENT = object()
"""`Owned.before` of a flag that has been in the identity since runs were first recorded."""
SPEED = "a speed path: the same arithmetic, chosen per machine"
SOURCE = "in training_data / validation_data: the rows' content, wherever they are read from"


@dataclass(frozen=True)
class Owned:
    """A flag that only `families` read."""

    families: tuple[str, ...]
    what: str
    """What the flag does, as the refusal says it ("--packing packs a causal LM's rows")."""
    asks: tuple | None = None
    """The values that ask for what only those families have (None: any value but the default); the
    others (--padding_free false) ask for what every family does."""
    left_out: str | None = None
    """Why the flag is not in the run's identity (None: it is, where a family reading it runs)."""
    before: object = ABSENT
    """The value runs recorded before the flag entered the identity had (identity.py ADDED_LATER)."""


def owners() -> dict[str, Owned]:
    """Each family flag and the families that read it (the seam's table, read when asked: the families'
    flag modules import this one)."""
    from finetune.families import FLAG_OWNERS

    return FLAG_OWNERS


def reads(config, flag: str) -> bool:
    """Whether `config`'s --task_type reads `flag` (every family reads a flag no family declares)."""
    owned, family = owners().get(flag), config.task_type
    return owned is None or family in owned.families


def refuse_other_families_flags(config, defaults: dict) -> None:
    """Each family flag that `config` sets for a --task_type that does not read it, refused naming both
    (`defaults`: each flag's default, as the dataclass declares it)."""
    family = config.task_type
    for flag, owned in owners().items():
        if family in owned.families:
            continue
        value = getattr(config, flag)
        if value in owned.asks if owned.asks else value != defaults[flag]:
            shown = f"--{flag} {value}" if owned.asks else f"--{flag}"
            readers = " or ".join(owned.families)
            raise ConfigError(
                f"{shown} {owned.what}: it is for --task_type {readers}, not {family}; drop it",
                flag=f"--{flag}",
                fix=f"drop --{flag}",
            )
