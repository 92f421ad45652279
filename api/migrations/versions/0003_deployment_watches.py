"""Deployment watches (#48): what a running deployment is, its SLA and thresholds, and every period's decision.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "topotune_watches",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("urls", sa.JSON(), nullable=False),
        sa.Column("deployment", sa.String(512), nullable=False),
        sa.Column("serve_flags", sa.Text(), nullable=False),
        sa.Column("model_path", sa.String(4096), nullable=False),
        sa.Column("hardware", sa.String(64), nullable=False),
        sa.Column("max_gpus", sa.Integer(), nullable=False),
        sa.Column("max_ttft_ms", sa.Float(), nullable=True),
        sa.Column("max_itl_ms", sa.Float(), nullable=True),
        sa.Column("percentile", sa.String(8), nullable=False),
        sa.Column("period_s", sa.Float(), nullable=False),
        sa.Column("thresholds", sa.JSON(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.Column("last_checked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "topotune_watch_events",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("watch_id", sa.Integer(), sa.ForeignKey("topotune_watches.id", ondelete="CASCADE"), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("window_s", sa.Float(), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
    )
    op.create_index("ix_topotune_watch_events_watch_id", "topotune_watch_events", ["watch_id"])


def downgrade() -> None:
    op.drop_index("ix_topotune_watch_events_watch_id", table_name="topotune_watch_events")
    op.drop_table("topotune_watch_events")
    op.drop_table("topotune_watches")
