/*
 * A test double of NVIDIA's NVML (libnvidia-ml.so.1) for faultmesh's tests (issue 33).
 *
 * It exports the NVML calls deviced's nvml backend makes through nvidia-ml-py (same names, argument
 * lists and struct layouts as nvml.h; nvidia-ml-py loads it by its own lookup, CDLL("libnvidia-ml.so.1"),
 * so the tests put its directory on LD_LIBRARY_PATH of the deviced process). It is driven through a
 * control file shared with the test (env FMNVML_CTL = its path, mapped with mmap; layout: struct ctl
 * below, mirrored by tests/native/nvml_ctl.py), so a test controls a deviced in another process:
 *   g[i].lost                  every query of GPU i returns NVML_ERROR_GPU_IS_LOST (15)
 *   g[i].events_unsupported    nvmlDeviceRegisterEvents returns NVML_ERROR_NOT_SUPPORTED (3)
 *   hang_call / hang_ms / hang_gpu   the call named hang_call ("*" = every call) sleeps hang_ms first
 *   ring[] / ev_head           events the test appends (gpu, type, data); nvmlEventSetWait_v2 hands
 *                              them out in order and advances ev_tail
 *   the other g[i] fields      what the health queries return (ECC, remap, NVLink, PCIe, clocks, temp)
 * Without FMNVML_CTL, nvmlInitWithFlags returns NVML_ERROR_DRIVER_NOT_LOADED (9).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MAXG 16
#define NLINK 4
#define RING 4096
#define CTL_MAGIC 0x4E564D4CU /* "NVML" */

#define OK 0
#define E_UNINIT 1
#define E_INVALID 2
#define E_NOT_SUPPORTED 3
#define E_INSUFFICIENT 7
#define E_DRIVER 9
#define E_TIMEOUT 10
#define E_LOST 15

struct gpu {
    uint32_t lost, events_unsupported;
    uint32_t retired_pending, remap_pending, remap_failure, remap_unsupported;
    uint32_t temp, temp_slowdown, temp_shutdown;
    uint32_t pcie_replay;
    uint32_t nvlink_active_mask, nvlink_count;
    uint64_t throttle;
    uint64_t ecc[2][2]; /* [corrected, uncorrected][volatile, aggregate] */
    uint64_t nvlink_err[NLINK];
    uint32_t procs, pad;
};

struct ev {
    uint32_t gpu, pad;
    uint64_t type, data;
};

struct ctl {
    uint32_t magic, ngpu;
    uint32_t hang_ms, hang_gpu; /* hang_gpu 0xFFFFFFFF = every GPU */
    char hang_call[64];
    volatile uint64_t ev_head, ev_tail, calls;
    struct gpu g[MAXG];
    struct ev ring[RING];
};

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    void *device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

static struct ctl *C;
static uint64_t registered[MAXG]; /* event mask per GPU */
static int evset_token;

static int dev_index(void *h) {
    uintptr_t v = (uintptr_t)h;
    if (!C || v < 0x1000 || v >= 0x1000 + C->ngpu) return -1;
    return (int)(v - 0x1000);
}

static void maybe_hang(const char *name, int gpu) {
    if (!C) return;
    __atomic_add_fetch(&C->calls, 1, __ATOMIC_SEQ_CST);
    uint32_t ms = C->hang_ms;
    if (!ms) return;
    if (strcmp(C->hang_call, "*") != 0 && strncmp(C->hang_call, name, sizeof(C->hang_call)) != 0) return;
    if (C->hang_gpu != 0xFFFFFFFFU && (int)C->hang_gpu != gpu) return;
    usleep((useconds_t)ms * 1000);
}

/* Per-device prologue: hang, bad handle, lost GPU. Sets *out to the GPU. */
#define DEV(name)                                  \
    int i = dev_index(device);                     \
    maybe_hang(name, i);                           \
    if (!C) return E_UNINIT;                       \
    if (i < 0) return E_INVALID;                   \
    if (C->g[i].lost) return E_LOST;               \
    struct gpu *g = &C->g[i];                      \
    (void)g;

static char ctl_path[4096];

int nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    const char *path = getenv("FMNVML_CTL");
    if (!path) return E_DRIVER;
    if (C && strcmp(path, ctl_path) == 0) return OK;
    if (C) { /* another control file (in-process tests): map that one */
        munmap(C, sizeof(struct ctl));
        C = NULL;
    }
    snprintf(ctl_path, sizeof(ctl_path), "%s", path);
    int fd = open(path, O_RDWR);
    if (fd < 0) return E_DRIVER;
    void *p = mmap(NULL, sizeof(struct ctl), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return E_DRIVER;
    C = p;
    if (C->magic != CTL_MAGIC || C->ngpu > MAXG) {
        munmap(p, sizeof(struct ctl));
        C = NULL;
        return E_DRIVER;
    }
    maybe_hang("nvmlInitWithFlags", -1);
    return OK;
}

int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
int nvmlShutdown(void) { return OK; }

const char *nvmlErrorString(int rc) {
    switch (rc) {
    case OK: return "Success";
    case E_UNINIT: return "Uninitialized";
    case E_INVALID: return "Invalid Argument";
    case E_NOT_SUPPORTED: return "Not Supported";
    case E_INSUFFICIENT: return "Insufficient Size";
    case E_DRIVER: return "Driver Not Loaded";
    case E_TIMEOUT: return "Timeout";
    case E_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

int nvmlSystemGetDriverVersion(char *buf, unsigned int n) {
    maybe_hang("nvmlSystemGetDriverVersion", -1);
    snprintf(buf, n, "550.0-faultmesh-test");
    return OK;
}

int nvmlSystemGetNVMLVersion(char *buf, unsigned int n) {
    snprintf(buf, n, "12.550.0");
    return OK;
}

int nvmlDeviceGetCount_v2(unsigned int *count) {
    maybe_hang("nvmlDeviceGetCount_v2", -1);
    if (!C) return E_UNINIT;
    *count = C->ngpu;
    return OK;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
    maybe_hang("nvmlDeviceGetHandleByIndex_v2", (int)index);
    if (!C) return E_UNINIT;
    if (index >= C->ngpu) return E_INVALID;
    *device = (void *)(uintptr_t)(0x1000 + index);
    return OK;
}

int nvmlDeviceGetIndex(void *device, unsigned int *index) {
    DEV("nvmlDeviceGetIndex");
    *index = (unsigned int)i;
    return OK;
}

int nvmlDeviceGetMinorNumber(void *device, unsigned int *minor) {
    DEV("nvmlDeviceGetMinorNumber");
    *minor = (unsigned int)i;
    return OK;
}

int nvmlDeviceGetUUID(void *device, char *buf, unsigned int n) {
    DEV("nvmlDeviceGetUUID");
    snprintf(buf, n, "GPU-fa017e57-0000-4000-8000-%012d", i);
    return OK;
}

int nvmlDeviceGetSerial(void *device, char *buf, unsigned int n) {
    DEV("nvmlDeviceGetSerial");
    snprintf(buf, n, "165%010d", i);
    return OK;
}

int nvmlDeviceGetName(void *device, char *buf, unsigned int n) {
    DEV("nvmlDeviceGetName");
    snprintf(buf, n, "NVIDIA H100 80GB HBM3 (faultmesh test)");
    return OK;
}

int nvmlDeviceGetPciInfo_v3(void *device, nvmlPciInfo_t *pci) {
    DEV("nvmlDeviceGetPciInfo_v3");
    memset(pci, 0, sizeof(*pci));
    pci->domain = 0;
    pci->bus = 0x18 + (unsigned)i;
    pci->pciDeviceId = 0x233010DE;
    snprintf(pci->busId, sizeof(pci->busId), "00000000:%02X:00.0", pci->bus);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "0000:%02X:00.0", pci->bus);
    return OK;
}

int nvmlDeviceGetSupportedEventTypes(void *device, unsigned long long *types) {
    DEV("nvmlDeviceGetSupportedEventTypes");
    *types = g->events_unsupported ? 0 : (0x1ULL | 0x2ULL | 0x8ULL);
    return OK;
}

int nvmlEventSetCreate(void **set) {
    maybe_hang("nvmlEventSetCreate", -1);
    if (!C) return E_UNINIT;
    memset(registered, 0, sizeof(registered));
    *set = &evset_token;
    return OK;
}

int nvmlDeviceRegisterEvents(void *device, unsigned long long types, void *set) {
    DEV("nvmlDeviceRegisterEvents");
    if (set != &evset_token) return E_INVALID;
    if (g->events_unsupported) return E_NOT_SUPPORTED;
    registered[i] |= types;
    return OK;
}

int nvmlEventSetWait_v2(void *set, nvmlEventData_t *data, unsigned int timeoutms) {
    maybe_hang("nvmlEventSetWait_v2", -1);
    if (!C) return E_UNINIT;
    if (set != &evset_token) return E_INVALID;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        uint64_t tail = C->ev_tail;
        if (tail < __atomic_load_n(&C->ev_head, __ATOMIC_ACQUIRE)) {
            struct ev e = C->ring[tail % RING];
            C->ev_tail = tail + 1;
            if (e.gpu < C->ngpu && (registered[e.gpu] & e.type)) {
                memset(data, 0, sizeof(*data));
                data->device = (void *)(uintptr_t)(0x1000 + e.gpu);
                data->eventType = e.type;
                data->eventData = e.data;
                data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFU;
                return OK;
            }
            continue;
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
        long ms = (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
        if (ms >= (long)timeoutms) return E_TIMEOUT;
        usleep(500);
    }
}

int nvmlEventSetFree(void *set) {
    (void)set;
    memset(registered, 0, sizeof(registered));
    return OK;
}

int nvmlDeviceGetTotalEccErrors(void *device, int type, int counter, unsigned long long *count) {
    DEV("nvmlDeviceGetTotalEccErrors");
    if (type < 0 || type > 1 || counter < 0 || counter > 1) return E_INVALID;
    *count = g->ecc[type][counter];
    return OK;
}

int nvmlDeviceGetRetiredPagesPendingStatus(void *device, int *pending) {
    DEV("nvmlDeviceGetRetiredPagesPendingStatus");
    *pending = (int)g->retired_pending;
    return OK;
}

int nvmlDeviceGetRemappedRows(void *device, unsigned int *corr, unsigned int *unc, unsigned int *pending,
                              unsigned int *failure) {
    DEV("nvmlDeviceGetRemappedRows");
    if (g->remap_unsupported) return E_NOT_SUPPORTED;
    *corr = 0;
    *unc = g->remap_pending ? 1 : 0;
    *pending = g->remap_pending;
    *failure = g->remap_failure;
    return OK;
}

int nvmlDeviceGetNvLinkState(void *device, unsigned int link, unsigned int *active) {
    DEV("nvmlDeviceGetNvLinkState");
    if (link >= g->nvlink_count || link >= NLINK) return E_INVALID;
    *active = (g->nvlink_active_mask >> link) & 1U;
    return OK;
}

int nvmlDeviceGetNvLinkErrorCounter(void *device, unsigned int link, int counter, unsigned long long *v) {
    DEV("nvmlDeviceGetNvLinkErrorCounter");
    if (link >= g->nvlink_count || link >= NLINK) return E_INVALID;
    *v = counter == 0 ? g->nvlink_err[link] : 0; /* all errors count as DL replays */
    return OK;
}

int nvmlDeviceGetPcieReplayCounter(void *device, unsigned int *v) {
    DEV("nvmlDeviceGetPcieReplayCounter");
    *v = g->pcie_replay;
    return OK;
}

int nvmlDeviceGetCurrentClocksEventReasons(void *device, unsigned long long *r) {
    DEV("nvmlDeviceGetCurrentClocksEventReasons");
    *r = g->throttle;
    return OK;
}

int nvmlDeviceGetCurrentClocksThrottleReasons(void *device, unsigned long long *r) {
    return nvmlDeviceGetCurrentClocksEventReasons(device, r);
}

int nvmlDeviceGetTemperature(void *device, int sensor, unsigned int *temp) {
    DEV("nvmlDeviceGetTemperature");
    if (sensor != 0) return E_INVALID;
    *temp = g->temp;
    return OK;
}

int nvmlDeviceGetTemperatureThreshold(void *device, int which, unsigned int *temp) {
    DEV("nvmlDeviceGetTemperatureThreshold");
    if (which == 0) *temp = g->temp_shutdown;
    else if (which == 1) *temp = g->temp_slowdown;
    else return E_NOT_SUPPORTED;
    return OK;
}

int nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned int *count, nvmlProcessInfo_t *infos) {
    DEV("nvmlDeviceGetComputeRunningProcesses_v3");
    if (*count < g->procs || (g->procs && !infos)) {
        *count = g->procs;
        return E_INSUFFICIENT;
    }
    for (unsigned k = 0; k < g->procs; k++) {
        infos[k].pid = 1000 + k;
        infos[k].usedGpuMemory = 1ULL << 30;
        infos[k].gpuInstanceId = infos[k].computeInstanceId = 0xFFFFFFFFU;
    }
    *count = g->procs;
    return OK;
}
