/*
 * A stand-in for pyxis (NVIDIA's SPANK plugin that runs job steps in enroot containers),
 * for the local test cluster, where no container runtime can be installed: it gives srun the
 * options pyxis adds (--container-image, --container-mounts, --container-workdir) so that
 * srun accepts them, and in each task it appends one line to the file named by its `log=`
 * argument: the job, the task, its node's index in the step and the options srun passed on. The task then runs on the
 * host, in --container-workdir as pyxis would start it. No image is opened.
 *
 *   gcc -shared -fPIC -o pyxis_stub.so pyxis_stub.c     (Debian: libslurm-dev for spank.h)
 *   plugstack.conf:  optional /path/pyxis_stub.so log=/path/pyxis.log
 */
#include <slurm/spank.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

SPANK_PLUGIN(pyxis_stub, 1);

static char *image, *mounts, *workdir;
static const char *log_path;

static int keep(char **slot, const char *value) {
    free(*slot);
    *slot = strdup(value ? value : "");
    return *slot ? ESPANK_SUCCESS : ESPANK_ERROR;
}

static int on_image(int val, const char *optarg, int remote) { return keep(&image, optarg); }
static int on_mounts(int val, const char *optarg, int remote) { return keep(&mounts, optarg); }
static int on_workdir(int val, const char *optarg, int remote) { return keep(&workdir, optarg); }

struct spank_option spank_options[] = {
    {"container-image", "IMAGE", "[stand-in] the image a step runs in", 1, 0, on_image},
    {"container-mounts", "SRC:DST[,...]", "[stand-in] bind mounts", 1, 0, on_mounts},
    {"container-workdir", "DIR", "[stand-in] working directory in the image", 1, 0, on_workdir},
    SPANK_OPTIONS_TABLE_END
};

int slurm_spank_init(spank_t sp, int ac, char **av) {
    for (int i = 0; i < ac; i++)
        if (strncmp(av[i], "log=", 4) == 0) log_path = av[i] + 4;
    return ESPANK_SUCCESS;
}

/* in each task, as root, before the task's program is started */
int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av) {
    if (!image || !log_path) return ESPANK_SUCCESS;
    uint32_t task = 0, job = 0, node = 0;
    spank_get_item(sp, S_TASK_GLOBAL_ID, &task);
    spank_get_item(sp, S_JOB_ID, &job);
    spank_get_item(sp, S_JOB_NODEID, &node);
    FILE *f = fopen(log_path, "a");
    if (!f) return ESPANK_SUCCESS;
    fprintf(f, "job=%u task=%u nodeid=%u image=%s mounts=%s workdir=%s\n", job, task, node,
            image, mounts ? mounts : "", workdir ? workdir : "");
    fclose(f);
    return ESPANK_SUCCESS;
}

/* in each task, as its user: start where pyxis would (--container-workdir) */
int slurm_spank_task_init(spank_t sp, int ac, char **av) {
    if (image && workdir && *workdir && chdir(workdir) != 0)
        slurm_error("pyxis stand-in: cannot enter --container-workdir %s", workdir);
    return ESPANK_SUCCESS;
}
