"""Exceptions and warnings that cross flowsim's public boundary."""


class ConfigError(ValueError):
    """A user input breaks a rule.

    The message has the form ``<field>: <rule> (got <value>)`` so that the CLI can print it as one line.
    """

    def __init__(self, field: str, rule: str, got=None):
        self.field = field
        self.rule = rule
        self.got = got
        msg = f"{field}: {rule}"
        if got is not None:
            msg += f" (got {got})"
        super().__init__(msg)

    def __reduce__(self):
        """Pickle with the fields, so the error crosses process pools (``ProcessPoolExecutor``, Dask) intact."""
        return type(self), (self.field, self.rule, self.got)


def did_you_mean(name: str, known) -> str:
    """``"; did you mean X?"`` for the closest of ``known`` to an unknown ``name`` (difflib), or ``""``."""
    import difflib

    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
    return f"; did you mean {close[0]}?" if close else ""


class FlowsimWarning(UserWarning):
    """Input that is allowed but suspicious (for example a GPU scaled from a neighbour)."""


def check_ints(obj, names, minimum: int) -> None:
    """Raise ConfigError for the first attribute of ``obj`` in ``names`` that is not an integer >= ``minimum``."""
    rule = "must be a positive integer" if minimum == 1 else "must be a non-negative integer"
    for name in names:
        v = getattr(obj, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
            raise ConfigError(name, rule, v)
