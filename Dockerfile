# MiA with the production server's extras (compose.yaml). llama-cpp-python compiles llama.cpp here.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends build-essential cmake && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY . /app
# torch's CPU build: the default index would pull the CUDA one (gigabytes).
RUN pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu -e '.[server]'
ENV MIA_HOME=/data/mia
