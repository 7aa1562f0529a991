"""The main job: prepare data, pretrain a Llama model as a 2-node torchrun gang, evaluate, export.

    python examples/llama_pretrain.py run                       # embedded defaults; same as `stoker quickstart`
    python examples/llama_pretrain.py run --set train.steps=200 --set train.lr=1e-3
    python examples/llama_pretrain.py run --config examples/configs/llama2_7b.toml

The flow lives in src/stoker/recipes/llama_pretrain.py (shipped with the package so that `stoker quickstart`
works after `pip install`); its defaults are src/stoker/recipes/llama_pretrain.toml.
"""

from stoker.recipes.llama_pretrain import LlamaPretrain

if __name__ == "__main__":
    LlamaPretrain()
