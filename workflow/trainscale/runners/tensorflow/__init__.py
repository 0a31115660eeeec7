"""The Keras loop (`keras_loop`, with its input, data and evaluation parts) and the strategies
that run on it: single and tf.distribute's Mirrored and MultiWorker (`tf`), ParameterServer
(`tf_ps`), and Horovod-Keras."""
