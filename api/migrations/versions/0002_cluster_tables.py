"""The cluster calibration tables (tuner.cluster's runs and failures), created once at service start.

Studies started at once used to create them on first use and race each other on a fresh database; the service
now creates them here, before it serves. The definition is tuner.cluster's (the CLI creates the same tables on
first use, so they may already exist: each is created only when missing, then verified).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

from alembic import op

from tuner.cluster import cluster_metadata, create_cluster_tables

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_cluster_tables(op.get_bind(), cluster_metadata())


def downgrade() -> None:
    # The tables hold measured runs the CLI may have written before the service existed: a downgrade of the
    # service's schema leaves them (and their data) in place.
    pass
