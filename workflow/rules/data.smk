rule download_mnist:
    output:
        [f"{config['data_dir']}/{f}" for f in ts_data.info("mnist").files],
    log:
        "logs/download/mnist.log",
    localrule: True
    conda:
        "../../envs/torch.yaml"
    params:
        data_dir=lambda w, output: data_dir_of(output[0]),
    shell:
        "python -m trainscale.data download mnist {params.data_dir:q} > {log:q} 2>&1"


rule download_cifar10:
    output:
        [f"{config['data_dir']}/{f}" for f in ts_data.info("cifar10").files],
    log:
        "logs/download/cifar10.log",
    localrule: True
    conda:
        "../../envs/torch.yaml"
    params:
        data_dir=lambda w, output: data_dir_of(output[0]),
    shell:
        "python -m trainscale.data download cifar10 {params.data_dir:q} > {log:q} 2>&1"


rule download:
    input:
        rules.download_mnist.output,
        rules.download_cifar10.output,


rule export_data:
    input:
        [f"{config['data_dir']}/{f}" for f in ts_data.info(EXPORT_DATASET).files],
    output:
        directory(f"results/export/{EXPORT_DATASET}"),
    log:
        f"logs/export/{EXPORT_DATASET}.log",
    localrule: True
    conda:
        "../../envs/torch.yaml"
    params:
        dataset=EXPORT_DATASET,
        data_dir=config["data_dir"],
        shard_size=config["export_data"]["shard_size"],
    shell:
        "python -m trainscale.data.export_data {params.dataset} {params.data_dir:q} {output:q}"
        " --shard-size {params.shard_size} > {log:q} 2>&1"
