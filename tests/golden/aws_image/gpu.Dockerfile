# stoker image, kind gpu: rendered by `stoker image`, do not edit (re-render instead).
# No CMD: AWS Batch passes the node command. No secrets: nothing here is one.
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
ENV DEBIAN_FRONTEND=noninteractive VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* && python3 -m venv /opt/venv

# torch's CUDA build (PyPI's Linux x86_64 wheel, CUDA libraries as pip packages)
RUN python -m pip install --no-cache-dir torch==2.13.0

# stoker; the base image's torch (and Neuron) builds stay: pip may add packages, not replace those
# stoker's dependencies: the versions pins.txt lists (resolved where the image was built)
COPY stoker-0.1.0-py3-none-any.whl pins.txt /tmp/stoker/
RUN mkdir -p /tmp/stoker && python -m pip freeze | grep -iE '^(torch|torch-neuronx|torch-xla|torchvision|neuronx-cc|libneuronxla|neuronx-distributed|numpy)==' > /tmp/stoker/keep.txt; \
    python -m pip install --no-cache-dir --constraint /tmp/stoker/keep.txt --constraint /tmp/stoker/pins.txt "/tmp/stoker/stoker-0.1.0-py3-none-any.whl[train,data,aws]" \
 && rm -rf /tmp/stoker \
 && python -c "import stoker, torch; print('stoker', stoker.__version__, 'torch', torch.__version__)"

RUN useradd --create-home --uid 10001 --shell /bin/bash stoker \
 && mkdir -p /workspace && chown stoker:stoker /workspace
USER stoker
WORKDIR /workspace
