# One image; the role is chosen by the command: `switchboard web`, `switchboard worker`, `switchboard run`.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY switchboard ./switchboard
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 switchboard
COPY --from=build /install /usr/local
COPY config /app/config
WORKDIR /app
ENV SWITCHBOARD_DATA_DIR=/app/data \
    SWITCHBOARD_CONFIG=/app/config/switchboard.yaml \
    PYTHONUNBUFFERED=1
# Mount points of config/compose.yaml's volumes: a new named volume takes its owner from the image's directory.
RUN mkdir -p /app/data/skills /app/workspaces && chown -R switchboard /app/data /app/workspaces
USER switchboard
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s \
  CMD python -c "import os,urllib.request,sys; urllib.request.urlopen(f'http://127.0.0.1:{os.environ.get(\"SWITCHBOARD_PORT\",\"8080\")}/healthz', timeout=2)" || exit 1
CMD ["switchboard", "web"]
