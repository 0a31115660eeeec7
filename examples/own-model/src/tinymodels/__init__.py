"""tinymodels: the example package of docs/own-model.md, small enough to train on a laptop.

Three builders trainscale can call by name from a study's ``models:`` section:

- ``tinymodels.vit:build``: a ViT-style image classifier in PyTorch;
- ``tinymodels.vit_keras:build``: its tf-keras 2 twin, parameter for parameter, so the
  TensorFlow and Horovod-Keras strategies train the same network;
- ``tinymodels.lm:build``: a causal language model in PyTorch.

Both PyTorch models keep their whole computation in one ``nn.Sequential`` named ``blocks``
(``forward`` is ``self.blocks(x)``), so trainscale can cut it into pipeline stages and shard
it block by block. Nothing here imports trainscale: a model package stays the user's own.
"""
