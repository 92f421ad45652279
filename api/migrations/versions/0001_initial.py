"""The service's first tables: study requests, registered models, events.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_STUDY_STATUS = sa.Enum("QUEUED", "RUNNING", "CANCELLING", "CANCELLED", "SUCCEEDED", "FAILED", name="studystatus",
                        native_enum=False, length=16)
_MODEL_STATUS = sa.Enum("TUNING", "DOES_NOT_FIT", "UNSUPPORTED", "REGISTERED", name="modelstatus",
                        native_enum=False, length=16)


def upgrade() -> None:
    op.create_table(
        "topotune_studies",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("campaign", sa.String(512), nullable=False, unique=True),
        sa.Column("model_name", sa.String(256), nullable=False),
        sa.Column("model_path", sa.String(4096), nullable=False),
        sa.Column("space", sa.JSON(), nullable=False),
        sa.Column("space_name", sa.String(256), nullable=False),
        sa.Column("backend", sa.String(32), nullable=False),
        sa.Column("backend_options", sa.JSON(), nullable=False),
        sa.Column("trials_per_phase", sa.Integer(), nullable=False),
        sa.Column("sampler", sa.String(16), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("warm_start", sa.Boolean(), nullable=False),
        sa.Column("status", _STUDY_STATUS, nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("resumes", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_topotune_studies_status", "topotune_studies", ["status"])
    op.create_table(
        "topotune_models",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("path", sa.String(4096), nullable=False, unique=True),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("status", _MODEL_STATUS, nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("study_id", sa.Integer(), sa.ForeignKey("topotune_studies.id", ondelete="SET NULL"),
                  nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "topotune_events",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("study_id", sa.Integer(), sa.ForeignKey("topotune_studies.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("phase", sa.String(16), nullable=True),
        sa.Column("trial_number", sa.Integer(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
    )
    op.create_index("ix_topotune_events_study_id", "topotune_events", ["study_id"])


def downgrade() -> None:
    op.drop_index("ix_topotune_events_study_id", "topotune_events")
    op.drop_table("topotune_events")
    op.drop_table("topotune_models")
    op.drop_index("ix_topotune_studies_status", "topotune_studies")
    op.drop_table("topotune_studies")
