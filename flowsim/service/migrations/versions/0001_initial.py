"""The first schema: users, tokens, jobs, results, points, memory_pruned, measurements, workers.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table("users",
                    sa.Column("id", sa.Integer, primary_key=True),
                    sa.Column("name", sa.String(128), nullable=False, unique=True),
                    sa.Column("is_admin", sa.Boolean, nullable=False),
                    sa.Column("created_s", sa.Float, nullable=False))
    op.create_table("tokens",
                    sa.Column("id", sa.Integer, primary_key=True),
                    sa.Column("user_id", sa.Integer, sa.ForeignKey("users.id"), nullable=False),
                    sa.Column("token_sha256", sa.String(64), nullable=False, unique=True),
                    sa.Column("created_s", sa.Float, nullable=False))
    op.create_table("jobs",
                    sa.Column("id", sa.String(32), primary_key=True),
                    sa.Column("owner_id", sa.Integer, sa.ForeignKey("users.id"), nullable=False),
                    sa.Column("kind", sa.String(16), nullable=False),
                    sa.Column("state", sa.String(16), nullable=False),
                    sa.Column("params_json", sa.Text, nullable=False),
                    sa.Column("key", sa.String(64), nullable=False),
                    sa.Column("progress", sa.Float, nullable=False),
                    sa.Column("message", sa.Text),
                    sa.Column("created_s", sa.Float, nullable=False),
                    sa.Column("started_s", sa.Float),
                    sa.Column("finished_s", sa.Float),
                    sa.Column("attempts", sa.Integer, nullable=False),
                    sa.Column("lease_owner", sa.String(64)),
                    sa.Column("lease_expires_s", sa.Float),
                    sa.Column("reused", sa.Boolean, nullable=False))
    op.create_index("jobs_state_created", "jobs", ["state", "created_s"])
    op.create_index("jobs_owner", "jobs", ["owner_id"])
    op.create_index("jobs_key", "jobs", ["key"])
    op.create_table("results",
                    sa.Column("key", sa.String(64), primary_key=True),
                    sa.Column("kind", sa.String(16), nullable=False),
                    sa.Column("job_id", sa.String(32), nullable=False),
                    sa.Column("result_json", sa.Text, nullable=False),
                    sa.Column("created_s", sa.Float, nullable=False))
    op.create_table("points",
                    sa.Column("key", sa.String(64), primary_key=True),
                    sa.Column("study", sa.String(128), nullable=False),
                    sa.Column("config_json", sa.Text, nullable=False),
                    sa.Column("point_json", sa.Text, nullable=False),
                    sa.Column("created_s", sa.Float, nullable=False))
    op.create_table("memory_pruned",
                    sa.Column("key", sa.String(64), primary_key=True),
                    sa.Column("memory_bytes_per_gpu", sa.Float, nullable=False))
    op.create_table("measurements",
                    sa.Column("id", sa.String(32), primary_key=True),
                    sa.Column("owner_id", sa.Integer, sa.ForeignKey("users.id"), nullable=False),
                    sa.Column("kind", sa.String(16), nullable=False),
                    sa.Column("filename", sa.String(255), nullable=False),
                    sa.Column("sha256", sa.String(64), nullable=False),
                    sa.Column("size_bytes", sa.Integer, nullable=False),
                    sa.Column("content", sa.LargeBinary, nullable=False),
                    sa.Column("summary_json", sa.Text, nullable=False),
                    sa.Column("created_s", sa.Float, nullable=False))
    op.create_table("workers",
                    sa.Column("id", sa.String(64), primary_key=True),
                    sa.Column("host", sa.String(255), nullable=False),
                    sa.Column("pid", sa.Integer, nullable=False),
                    sa.Column("started_s", sa.Float, nullable=False),
                    sa.Column("last_seen_s", sa.Float, nullable=False))


def downgrade() -> None:
    for table in ("workers", "measurements", "memory_pruned", "points", "results", "jobs", "tokens", "users"):
        op.drop_table(table)
