"""Alembic environment of the flowsim service database: runs on the engine :func:`flowsim.service.db.migrate`
passes in (no alembic.ini; online mode only)."""
from alembic import context

from flowsim.service.db import Base

engine = context.config.attributes["engine"]
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
