# The topotune image: the API with its runner, and the Ray head/worker (same code and Ray version on every node,
# so trials scheduled by the API run the same tuner code on the workers).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
# Optional: a CPU-only torch wheel index (torch is only needed by the GP sampler's fitting), e.g.
#   docker compose build --build-arg PIP_EXTRA_INDEX_URL=<your torch CPU index>
ARG PIP_EXTRA_INDEX_URL=""
ENV PIP_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL}

RUN useradd --create-home --uid 1000 topotune
WORKDIR /app
COPY pyproject.toml README.md ./
COPY tuner ./tuner
COPY api ./api
COPY search_spaces ./search_spaces
COPY examples ./examples
# Editable: api/templates and api/migrations are read from the source tree.
RUN pip install -e . && mkdir -p /data /models && chown topotune /data /models
USER topotune
ENV TOPOTUNE_DATA_DIR=/data TOPOTUNE_MODELS_DIR=/models
EXPOSE 8470
CMD ["topotune-api", "serve", "--host", "0.0.0.0"]
