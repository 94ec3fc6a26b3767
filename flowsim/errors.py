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


class FlowsimWarning(UserWarning):
    """Input that is allowed but suspicious (for example a GPU scaled from a neighbour)."""
