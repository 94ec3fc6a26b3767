"""API tokens: random Bearer tokens of which only the SHA-256 is stored.

A token is 32 random bytes (``secrets.token_urlsafe``, 256 bits), so one SHA-256 (no salt, no slow hash) is
enough to make a stolen table useless: nobody can invert it or guess a token (the reasoning of GitHub's and
PyPI's token stores). Every job, result and upload belongs to the token's user; an admin sees everyone's.
"""
from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.engine import Engine

from flowsim.errors import ConfigError
from flowsim.service.db import Token, User, session

TOKEN_BYTES = 32  # entropy of a token: 256 bits
TOKEN_PREFIX = "fs_"  # marks a flowsim token (secret scanners can match it)
NAME_MAX = 128  # characters of a user name (users.name is String(128))


@dataclass(frozen=True)
class Caller:
    """Who made a request: the user id, name and admin flag."""

    id: int
    name: str
    is_admin: bool


def token_hash(token: str) -> str:
    """SHA-256 (hex) of ``token``: what the tokens table stores."""
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(engine: Engine, name: str, admin: bool = False) -> str:
    """A new token for user ``name`` (created if new; ``admin`` makes the user an admin). Returns the token,
    which is shown once and never stored.

    Raises
    ------
    ConfigError
        ``name`` empty, too long or not printable.
    """
    if not name or len(name) > NAME_MAX or not name.isprintable():
        raise ConfigError("NAME", f"must be 1 to {NAME_MAX} printable characters", name)
    token = TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)
    now = time.time()
    with session(engine, write=True) as s:
        user = s.scalars(select(User).where(User.name == name)).first()
        if user is None:
            user = User(name=name, is_admin=admin, created_s=now)
            s.add(user)
            s.flush()
        elif admin and not user.is_admin:
            user.is_admin = True
        s.add(Token(user_id=user.id, token_sha256=token_hash(token), created_s=now))
    return token


def caller_of(engine: Engine, token: str) -> Caller | None:
    """The user holding ``token``, or None for an unknown token."""
    with session(engine) as s:
        row = s.execute(select(User.id, User.name, User.is_admin).join(Token, Token.user_id == User.id)
                        .where(Token.token_sha256 == token_hash(token))).first()
    return None if row is None else Caller(row.id, row.name, bool(row.is_admin))


def has_users(engine: Engine) -> bool:
    """True once any user exists."""
    with session(engine) as s:
        return s.scalars(select(User.id).limit(1)).first() is not None
