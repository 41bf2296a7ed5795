# CPU worker for Linux hosts. Mac workers run natively: Metal is not available in containers.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends build-essential cmake \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . /src
# Portable build (no -march=native): the image may run on another CPU than the builder's.
ENV H3R_NATIVE=OFF
RUN pip install --no-cache-dir . && rm -rf /src/build
WORKDIR /data
ENV H3RENDER_HOME=/data
CMD ["h3render", "worker"]
