/*
 * The hccsping (HCCS pingmesh) calls of the test libdcmi.so (built with every C file of tests/native by
 * tests/native/build.py), for faultmesh.dcmi.hccsping's ctypes binding.
 *
 * Exports dcmi_start_hccsping_mesh, dcmi_stop_hccsping_mesh, dcmi_get_hccsping_mesh_state and
 * dcmi_get_hccsping_mesh_info with the layouts of the DCMI API pages (reference noded.md §6), and a
 * control API prefixed "hccsimtest_":
 *   hccsimtest_reset()                                  no tasks, no path settings
 *   hccsimtest_set_path(dst_addr, loss_permille, delay) every chip's packets to dst_addr: that loss
 *                                                       (0..1000 per mille) and delay (µs)
 *   hccsimtest_wipe(card, dev)                          a chip reset: the chip's tasks vanish
 *   hccsimtest_set_dest_num(card, dev, n)               next info reports dest_num n (bad driver)
 *   hccsimtest_rounds(card, dev, task, rounds)          rounds the next info covers (default 1)
 *   hccsimtest_started(card, dev, task, buf, len)       copy of the running task's dst list (or -1)
 *   hccsimtest_sizeof(name)                             layout checks
 * Deterministic: of n packets, round(n * loss) are lost; answered packets take delay µs (min
 * delay-1, max and tp95 delay+1); -1 delays when nothing answered. Default delay 3 µs, no loss.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define IP_ADDR_LIST_LEN 1024
#define HCCS_PING_MESH_MAX_NUM 48
#define ADDR_MAX_LEN 16
#define MAX_CARDS 64
#define MAX_DEVS 4
#define MAX_PATHS 512
#define HRC_PARAM (-8001)

struct dcmi_hccsping_mesh_operate {
    char dst_addr_list[IP_ADDR_LIST_LEN];
    int pkt_size;
    int pkt_send_num;
    int pkt_interval;
    int timeout;
    int task_interval;
    int task_id;
};

struct dcmi_hccsping_mesh_info {
    char dst_addr[HCCS_PING_MESH_MAX_NUM][ADDR_MAX_LEN];
    unsigned int suc_pkt_num[HCCS_PING_MESH_MAX_NUM];
    unsigned int fail_pkt_num[HCCS_PING_MESH_MAX_NUM];
    long max_time[HCCS_PING_MESH_MAX_NUM];
    long min_time[HCCS_PING_MESH_MAX_NUM];
    long avg_time[HCCS_PING_MESH_MAX_NUM];
    long tp95_time[HCCS_PING_MESH_MAX_NUM];
    int reply_stat_num[HCCS_PING_MESH_MAX_NUM];
    unsigned long long ping_total_num[HCCS_PING_MESH_MAX_NUM];
    int dest_num;
};

struct task {
    int running;
    struct dcmi_hccsping_mesh_operate op;
    char dst[HCCS_PING_MESH_MAX_NUM][ADDR_MAX_LEN];
    int ndst;
    int rounds_next;
    unsigned long long rounds_total;
};

struct path {
    char addr[ADDR_MAX_LEN];
    int loss_permille;
    long delay;
};

static pthread_mutex_t hmu = PTHREAD_MUTEX_INITIALIZER;
static struct task tasks[MAX_CARDS][MAX_DEVS][2];
static int bad_dest_num[MAX_CARDS][MAX_DEVS];
static struct path paths[MAX_PATHS];
static int npaths;

static int chip_ok(int card, int dev) { return card >= 0 && card < MAX_CARDS && dev >= 0 && dev < MAX_DEVS; }

void hccsimtest_reset(void) {
    pthread_mutex_lock(&hmu);
    memset(tasks, 0, sizeof tasks);
    memset(bad_dest_num, 0, sizeof bad_dest_num);
    npaths = 0;
    pthread_mutex_unlock(&hmu);
}

int hccsimtest_set_path(const char *addr, int loss_permille, long delay) {
    if (!addr || strlen(addr) >= ADDR_MAX_LEN || loss_permille < 0 || loss_permille > 1000) return HRC_PARAM;
    pthread_mutex_lock(&hmu);
    int i;
    for (i = 0; i < npaths && strcmp(paths[i].addr, addr) != 0; i++) {
    }
    if (i == npaths) {
        if (npaths == MAX_PATHS) {
            pthread_mutex_unlock(&hmu);
            return HRC_PARAM;
        }
        npaths++;
        strcpy(paths[i].addr, addr);
    }
    paths[i].loss_permille = loss_permille;
    paths[i].delay = delay;
    pthread_mutex_unlock(&hmu);
    return 0;
}

int hccsimtest_wipe(int card, int dev) {
    if (!chip_ok(card, dev)) return HRC_PARAM;
    pthread_mutex_lock(&hmu);
    memset(tasks[card][dev], 0, sizeof tasks[card][dev]);
    pthread_mutex_unlock(&hmu);
    return 0;
}

int hccsimtest_set_dest_num(int card, int dev, int n) {
    if (!chip_ok(card, dev)) return HRC_PARAM;
    bad_dest_num[card][dev] = n;
    return 0;
}

int hccsimtest_rounds(int card, int dev, int task, int rounds) {
    if (!chip_ok(card, dev) || task < 0 || task > 1 || rounds < 1) return HRC_PARAM;
    pthread_mutex_lock(&hmu);
    tasks[card][dev][task].rounds_next = rounds;
    pthread_mutex_unlock(&hmu);
    return 0;
}

int hccsimtest_started(int card, int dev, int task, char *buf, int len) {
    if (!chip_ok(card, dev) || task < 0 || task > 1 || !buf || len <= 0) return HRC_PARAM;
    pthread_mutex_lock(&hmu);
    struct task *t = &tasks[card][dev][task];
    int rc = -1;
    if (t->running) {
        strncpy(buf, t->op.dst_addr_list, (size_t)len - 1);
        buf[len - 1] = 0;
        rc = t->op.pkt_size;
    }
    pthread_mutex_unlock(&hmu);
    return rc;
}

int hccsimtest_sizeof(const char *name) {
    if (!strcmp(name, "dcmi_hccsping_mesh_operate")) return (int)sizeof(struct dcmi_hccsping_mesh_operate);
    if (!strcmp(name, "dcmi_hccsping_mesh_info")) return (int)sizeof(struct dcmi_hccsping_mesh_info);
    return -1;
}

int dcmi_start_hccsping_mesh(int card_id, int device_id, int port_id, struct dcmi_hccsping_mesh_operate *op) {
    if (!chip_ok(card_id, device_id) || port_id != 0 || !op) return HRC_PARAM;
    if (op->pkt_size < 1792 || op->pkt_size > 3000 || op->pkt_send_num < 1 || op->pkt_send_num > 1000 ||
        op->pkt_interval < 0 || op->pkt_interval > 1000 || op->timeout < 0 || op->task_interval < 1 ||
        op->task_interval > 60 || op->task_id < 0 || op->task_id > 1)
        return HRC_PARAM;
    if (memchr(op->dst_addr_list, 0, IP_ADDR_LIST_LEN) == NULL) return HRC_PARAM;
    struct task t;
    memset(&t, 0, sizeof t);
    t.op = *op;
    char list[IP_ADDR_LIST_LEN];
    strcpy(list, op->dst_addr_list);
    char *save = NULL;
    for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (t.ndst == HCCS_PING_MESH_MAX_NUM || strlen(tok) >= ADDR_MAX_LEN) return HRC_PARAM;
        strcpy(t.dst[t.ndst++], tok);
    }
    if (t.ndst == 0) return HRC_PARAM;
    t.running = 1;
    t.rounds_next = 1;
    pthread_mutex_lock(&hmu);
    tasks[card_id][device_id][op->task_id] = t;
    pthread_mutex_unlock(&hmu);
    return 0;
}

int dcmi_stop_hccsping_mesh(int card_id, int device_id, int port_id, unsigned int task_id) {
    if (!chip_ok(card_id, device_id) || port_id != 0 || task_id > 1) return HRC_PARAM;
    pthread_mutex_lock(&hmu);
    tasks[card_id][device_id][task_id].running = 0;
    tasks[card_id][device_id][task_id].ndst = 0;
    pthread_mutex_unlock(&hmu);
    return 0;
}

int dcmi_get_hccsping_mesh_state(int card_id, int device_id, int port_id, unsigned int task_id,
                                 unsigned int *state) {
    if (!chip_ok(card_id, device_id) || port_id != 0 || task_id > 1 || !state) return HRC_PARAM;
    pthread_mutex_lock(&hmu);
    *state = tasks[card_id][device_id][task_id].running ? 1u : 0u;
    pthread_mutex_unlock(&hmu);
    return 0;
}

int dcmi_get_hccsping_mesh_info(int card_id, int device_id, int port_id, unsigned int task_id,
                                struct dcmi_hccsping_mesh_info *info) {
    if (!chip_ok(card_id, device_id) || port_id != 0 || task_id > 1 || !info) return HRC_PARAM;
    memset(info, 0, sizeof *info);
    pthread_mutex_lock(&hmu);
    struct task *t = &tasks[card_id][device_id][task_id];
    if (t->running) {
        int rounds = t->rounds_next > 0 ? t->rounds_next : 1;
        t->rounds_next = 1;
        t->rounds_total += (unsigned long long)rounds;
        for (int i = 0; i < t->ndst; i++) {
            int loss = 0;
            long delay = 3;
            for (int p = 0; p < npaths; p++)
                if (!strcmp(paths[p].addr, t->dst[i])) {
                    loss = paths[p].loss_permille;
                    delay = paths[p].delay;
                }
            long n = (long)rounds * t->op.pkt_send_num;
            long lost = (n * loss + 500) / 1000;
            strcpy(info->dst_addr[i], t->dst[i]);
            info->suc_pkt_num[i] = (unsigned int)(n - lost);
            info->fail_pkt_num[i] = (unsigned int)lost;
            int ok = n - lost > 0;
            info->avg_time[i] = ok ? delay : -1;
            info->min_time[i] = ok ? delay - 1 : -1;
            info->max_time[i] = ok ? delay + 1 : -1;
            info->tp95_time[i] = ok ? delay + 1 : -1;
            info->reply_stat_num[i] = rounds;
            info->ping_total_num[i] = t->rounds_total;
        }
        info->dest_num = t->ndst;
    }
    if (bad_dest_num[card_id][device_id]) {
        info->dest_num = bad_dest_num[card_id][device_id];
        bad_dest_num[card_id][device_id] = 0;
    }
    pthread_mutex_unlock(&hmu);
    return 0;
}
