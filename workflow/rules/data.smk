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
