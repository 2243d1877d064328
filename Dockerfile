# The planning service: `dhp serve` with the solver backends, on PostgreSQL (DATABASE_URL) or SQLite under /data.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

COPY pyproject.toml constraints.txt README.md ./
COPY optimizer ./optimizer
COPY solver_models ./solver_models
COPY planning ./planning
COPY jobs ./jobs
COPY api ./api
# The planner's kernels are compiled once here, into a cache the service user may read and refresh.
ENV NUMBA_CACHE_DIR=/opt/numba-cache
RUN pip install -c constraints.txt '.[solver,service]' \
    && python -c "from planning.planner import warm_up; print(f'kernels compiled in {warm_up():.0f} ms')" \
    && useradd --system --uid 10001 --home-dir /data dhp \
    && mkdir -p /data && chown dhp /data && chown -R dhp /opt/numba-cache

USER dhp
# Production mode refuses to listen on 0.0.0.0 without DHP_TOKENS (see api/service/settings.py).
ENV DHP_ENVIRONMENT=production DHP_HOST=0.0.0.0 DHP_PORT=8000 DHP_DATA_DIR=/data DHP_WORKERS=2
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=2).status != 200)"]
CMD ["dhp", "serve"]
