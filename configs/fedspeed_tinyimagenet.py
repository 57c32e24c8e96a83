"""FedSpeed, TinyImageNet (200 classes, 64 x 64), the slides' t1 setting (Sun et al., ICLR 2023,
experimental settings):
500 clients at 2 %, balanced Dirichlet 0.6 (--config.partition=iid for IID), batch 20,
2 local epochs (200 examples per client: K = 20), ResNet-18-GN. The slides give no
normalisation or augmentation for it; per-channel standardisation and crop_flip are this
config's choice. Needs the extracted tiny-imagenet-200 under <data_dir> (BUILD.md).
"""
from configs.fedspeed_cifar10_100c import slides_setting


def get_config():
  return slides_setting("tinyimagenet", num_clients=500, active_ratio=0.02, batch_size=20,
                        local_epochs=2)
