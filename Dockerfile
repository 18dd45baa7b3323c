# The memproj image: every worker kind and the CLI. Used by docker-compose.yml.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ops/constraints.txt ./
COPY topics ./topics
COPY projections ./projections
COPY streams ./streams
RUN pip install --no-cache-dir -c constraints.txt . \
    && useradd --create-home memproj && mkdir -p /data && chown memproj /data
USER memproj
ENV MEMPROJ_DATA_DIR=/data
ENTRYPOINT ["memproj"]
