/*
 * A test double of Huawei DCMI (libdcmi.so) for faultmesh's tests and bench.
 *
 * It exports the DCMI calls deviced binds (same names, argument lists and struct layouts as the
 * DCMI headers describe; see services/faultmesh/dcmi/structs.py) and a control API prefixed
 * "dcmitest_" that tests call through ctypes to drive it:
 *   dcmitest_reset(cards, devs_per_card)      fresh state: logic id = card*devs + dev, phy = logic
 *   dcmitest_set_phy(logic, phy)              change the physical id of a logic id
 *   dcmitest_set_codes(logic, codes*, n)      replace the live error-code list
 *   dcmitest_set_rc(name, logic, rc)          make call `name` return rc for a device (-1 = all)
 *   dcmitest_set_hang(name, ms)               make call `name` sleep ms first (a hanging driver)
 *   dcmitest_set_network(logic, result)       gateway-probe result (enum dcmi_rdfx_detect_result)
 *   dcmitest_set_procs(logic, n)              process count on the chip
 *   dcmitest_set_boot(logic, status)          boot status; a reset sets it to 16 after reset_boot_ms
 *   dcmitest_fire(logic, code, assertion, severity, update_list, wait)
 *                                            fire one callback from a new C thread (join when wait)
 *   dcmitest_storm_start(rate, duration_ms, ndev, ncodes, seed) / dcmitest_storm_wait()
 *                                            fire rate events/s from one C thread, updating the
 *                                            live lists; fire times kept per serial (monotonic ns)
 *   dcmitest_set_event_type(type)             struct dcmi_event.type of the next fired events
 *   dcmitest_calls(name)                      how many times call `name` ran
 *   dcmitest_sizeof(struct) / dcmitest_offsetof(struct, field)   layout checks
 * The v2 family (dcmiv2_*, dev id = logic id) maps onto the same state.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_DEV 64
#define MAX_CODES 128
#define RC_NOT_READY (-8012)
#define RC_PARAM (-8001)

struct dcmi_dms_fault_event {
    unsigned int event_id;
    unsigned short deviceid;
    unsigned char node_type;
    unsigned char node_id;
    unsigned char sub_node_type;
    unsigned char sub_node_id;
    unsigned char severity;
    unsigned char assertion;
    int event_serial_num;
    int notify_serial_num;
    unsigned long long alarm_raised_time;
    char event_name[256];
    char additional_info[32];
    unsigned char resv[32];
};

struct dcmi_event {
    int type;
    union {
        struct dcmi_dms_fault_event dms_event;
    } event_t;
};

struct dcmi_event_filter {
    unsigned long long filter_flag;
    unsigned int event_id;
    unsigned char severity;
    unsigned char node_type;
    unsigned char resv[32];
};

struct dcmi_spod_info {
    unsigned int sdid, scale_type, super_pod_id, server_id, chassis_id, super_pod_type;
    unsigned int reserve[6];
};

struct dcmi_proc_mem_info {
    int proc_id;
    unsigned long proc_mem_usage;
};

struct dcmi_chip_info {
    unsigned char chip_type[32];
    unsigned char chip_name[32];
    unsigned char chip_ver[32];
    unsigned int aicore_cnt;
};

typedef void (*dcmi_fault_event_callback)(struct dcmi_event *);

struct device {
    unsigned int codes[MAX_CODES];
    int ncodes;
    unsigned int health;
    int network;
    int procs;
    int boot;
    int phy;
    int resets;
};

#define NFUNCS 24
static const char *FUNC_NAMES[NFUNCS] = {
    "dcmi_init", "dcmi_get_card_list", "dcmi_get_device_num_in_card", "dcmi_get_device_logic_id",
    "dcmi_get_device_phyid_from_logicid", "dcmi_get_device_logicid_from_phyid",
    "dcmi_get_card_id_device_id_from_logicid", "dcmi_get_device_health", "dcmi_get_device_errorcode_v2",
    "dcmi_subscribe_fault_event", "dcmi_get_device_network_health", "dcmi_get_device_boot_status",
    "dcmi_set_device_reset", "dcmi_get_device_resource_info", "dcmi_get_device_info",
    "dcmi_get_netdev_brother_device", "dcmi_get_device_chip_info", "dcmi_pre_reset_soc", "dcmi_rescan_soc",
    "dcmi_get_device_outband_channel_state", "", "", "", ""};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct device devs[MAX_DEV];
static int n_cards = 1, per_card = 8;
static int rcs[NFUNCS][MAX_DEV + 1]; /* [func][logic+1], index 0 = all devices */
static int hang_ms[NFUNCS];
static long calls[NFUNCS];
static dcmi_fault_event_callback callback;
static int serial;
static int reset_boot_ms = 200;
static char chip_name[32] = "910B3";
static int event_type; /* struct dcmi_event.type of fired events (0 = DMS fault event) */

static int func_index(const char *name) {
    for (int i = 0; i < NFUNCS; i++)
        if (FUNC_NAMES[i][0] && strcmp(FUNC_NAMES[i], name) == 0) return i;
    return -1;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {}
}

static long long mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Count the call, sleep when told to hang, return the configured rc for (func, logic). */
static int enter(int f, int logic) {
    int rc, h;
    pthread_mutex_lock(&mu);
    calls[f]++;
    h = hang_ms[f];
    rc = rcs[f][0];
    if (logic >= 0 && logic < MAX_DEV && rcs[f][logic + 1] != 0) rc = rcs[f][logic + 1];
    pthread_mutex_unlock(&mu);
    if (h > 0) sleep_ms(h);
    return rc;
}

static int ndev(void) { return n_cards * per_card; }
static int logic_of(int card, int dev) {
    if (card < 0 || card >= n_cards || dev < 0 || dev >= per_card) return -1;
    return card * per_card + dev;
}

/* ---------------------------------------------------------------- control API */

void dcmitest_reset(int cards, int devs_per_card) {
    pthread_mutex_lock(&mu);
    memset(devs, 0, sizeof devs);
    memset(rcs, 0, sizeof rcs);
    memset(hang_ms, 0, sizeof hang_ms);
    memset(calls, 0, sizeof calls);
    n_cards = cards;
    per_card = devs_per_card;
    if (n_cards * per_card > MAX_DEV) per_card = MAX_DEV / (n_cards > 0 ? n_cards : 1);
    for (int i = 0; i < MAX_DEV; i++) {
        devs[i].phy = i;
        devs[i].boot = 16;
    }
    callback = NULL;
    serial = 0;
    event_type = 0;
    pthread_mutex_unlock(&mu);
}

int dcmitest_set_phy(int logic, int phy) {
    if (logic < 0 || logic >= MAX_DEV) return RC_PARAM;
    pthread_mutex_lock(&mu);
    devs[logic].phy = phy;
    pthread_mutex_unlock(&mu);
    return 0;
}

void dcmitest_set_chip_name(const char *name) {
    pthread_mutex_lock(&mu);
    strncpy(chip_name, name, sizeof chip_name - 1);
    pthread_mutex_unlock(&mu);
}

int dcmitest_set_codes(int logic, const unsigned int *codes, int n) {
    if (logic < 0 || logic >= MAX_DEV || n < 0 || n > MAX_CODES) return RC_PARAM;
    pthread_mutex_lock(&mu);
    memcpy(devs[logic].codes, codes, sizeof(unsigned int) * n);
    devs[logic].ncodes = n;
    pthread_mutex_unlock(&mu);
    return 0;
}

int dcmitest_set_rc(const char *name, int logic, int rc) {
    int f = func_index(name);
    if (f < 0 || logic < -1 || logic >= MAX_DEV) return RC_PARAM;
    pthread_mutex_lock(&mu);
    rcs[f][logic + 1] = rc;
    pthread_mutex_unlock(&mu);
    return 0;
}

int dcmitest_set_hang(const char *name, int ms) {
    int f = func_index(name);
    if (f < 0) return RC_PARAM;
    pthread_mutex_lock(&mu);
    hang_ms[f] = ms;
    pthread_mutex_unlock(&mu);
    return 0;
}

long dcmitest_calls(const char *name) {
    int f = func_index(name);
    long n;
    if (f < 0) return -1;
    pthread_mutex_lock(&mu);
    n = calls[f];
    pthread_mutex_unlock(&mu);
    return n;
}

int dcmitest_set_network(int logic, int result) {
    if (logic < 0 || logic >= MAX_DEV) return RC_PARAM;
    pthread_mutex_lock(&mu);
    devs[logic].network = result;
    pthread_mutex_unlock(&mu);
    return 0;
}

int dcmitest_set_procs(int logic, int n) {
    if (logic < 0 || logic >= MAX_DEV) return RC_PARAM;
    pthread_mutex_lock(&mu);
    devs[logic].procs = n;
    pthread_mutex_unlock(&mu);
    return 0;
}

int dcmitest_set_boot(int logic, int status, int reset_boot_delay_ms) {
    if (logic < 0 || logic >= MAX_DEV) return RC_PARAM;
    pthread_mutex_lock(&mu);
    devs[logic].boot = status;
    if (reset_boot_delay_ms >= 0) reset_boot_ms = reset_boot_delay_ms;
    pthread_mutex_unlock(&mu);
    return 0;
}

int dcmitest_resets(int logic) {
    if (logic < 0 || logic >= MAX_DEV) return RC_PARAM;
    return devs[logic].resets;
}

int dcmitest_subscribed(void) { return callback != NULL; }

/* Type of the events fired next (0 = DMS fault event; anything else is unknown to deviced). */
void dcmitest_set_event_type(int type) { event_type = type; }

/* Apply an event to the live list (occur adds, recover removes); caller holds mu. */
static void apply_to_list(int logic, unsigned int code, int assertion) {
    struct device *d = &devs[logic];
    int at = -1;
    for (int i = 0; i < d->ncodes; i++)
        if (d->codes[i] == code) at = i;
    if (assertion == 1 && at < 0 && d->ncodes < MAX_CODES) d->codes[d->ncodes++] = code;
    if (assertion == 0 && at >= 0) d->codes[at] = d->codes[--d->ncodes];
}

static void fill_event(struct dcmi_event *ev, int logic, unsigned int code, int assertion, int severity) {
    memset(ev, 0, sizeof *ev);
    ev->type = event_type;
    ev->event_t.dms_event.event_id = code;
    ev->event_t.dms_event.deviceid = (unsigned short)logic;
    ev->event_t.dms_event.severity = (unsigned char)severity;
    ev->event_t.dms_event.assertion = (unsigned char)assertion;
    ev->event_t.dms_event.alarm_raised_time = (unsigned long long)time(NULL);
    strcpy(ev->event_t.dms_event.event_name, "test event");
}

struct fire_arg {
    struct dcmi_event ev;
    dcmi_fault_event_callback cb;
};

static void *fire_thread(void *p) {
    struct fire_arg *a = p;
    a->cb(&a->ev);
    free(a);
    return NULL;
}

/* Fire one event from a new C thread. Returns 0, -1 when nobody subscribed, RC_PARAM on bad input. */
int dcmitest_fire(int logic, unsigned int code, int assertion, int severity, int update_list, int wait) {
    pthread_t t;
    struct fire_arg *a;
    if (logic < 0 || logic >= 0x10000) return RC_PARAM;
    pthread_mutex_lock(&mu);
    if (update_list && logic < MAX_DEV) apply_to_list(logic, code, assertion);
    if (!callback) {
        pthread_mutex_unlock(&mu);
        return -1;
    }
    a = malloc(sizeof *a);
    fill_event(&a->ev, logic, code, assertion, severity);
    a->ev.event_t.dms_event.event_serial_num = ++serial;
    a->cb = callback;
    pthread_mutex_unlock(&mu);
    if (pthread_create(&t, NULL, fire_thread, a) != 0) {
        free(a);
        return RC_PARAM;
    }
    if (wait) pthread_join(t, NULL);
    else pthread_detach(t);
    return 0;
}

/* ---- storm: many events from one C thread at a fixed rate */
static struct {
    pthread_t thread;
    int running;
    int rate, duration_ms, ndev, ncodes;
    unsigned int seed;
    long fired;
    long long *fire_ns; /* by serial - 1 */
    long cap;
} storm;

static unsigned int storm_codes[8] = {0x80E18008u, 0x80C98009u, 0x81078603u, 0x80CB8009u,
                                      0x8C084E00u, 0x80E01801u, 0x81AF8009u, 0x8C1F8609u};

static void *storm_thread(void *p) {
    (void)p;
    long total = (long)storm.rate * storm.duration_ms / 1000;
    long long start = mono_ns();
    struct dcmi_event ev;
    for (long i = 0; i < total && i < storm.cap; i++) {
        long long due = start + (long long)(i * 1000000000.0 / storm.rate);
        long long now = mono_ns();
        if (due > now) {
            struct timespec ts = {(due - now) / 1000000000LL, (due - now) % 1000000000LL};
            nanosleep(&ts, NULL);
        }
        int logic = rand_r(&storm.seed) % storm.ndev;
        unsigned int code = storm_codes[rand_r(&storm.seed) % storm.ncodes];
        int assertion = rand_r(&storm.seed) % 2;
        dcmi_fault_event_callback cb;
        pthread_mutex_lock(&mu);
        apply_to_list(logic, code, assertion);
        cb = callback;
        fill_event(&ev, logic, code, assertion, 2);
        ev.event_t.dms_event.event_serial_num = (int)(i + 1);
        storm.fire_ns[i] = mono_ns();
        pthread_mutex_unlock(&mu);
        if (cb) cb(&ev);
        storm.fired = i + 1;
    }
    return NULL;
}

int dcmitest_storm_start(int rate, int duration_ms, int ndev_, int ncodes, unsigned int seed) {
    if (storm.running || rate <= 0 || duration_ms <= 0 || ndev_ <= 0 || ndev_ > MAX_DEV || ncodes <= 0 ||
        ncodes > 8)
        return RC_PARAM;
    free(storm.fire_ns);
    storm.cap = (long)rate * duration_ms / 1000 + 1;
    storm.fire_ns = calloc(storm.cap, sizeof(long long));
    storm.rate = rate;
    storm.duration_ms = duration_ms;
    storm.ndev = ndev_;
    storm.ncodes = ncodes;
    storm.seed = seed;
    storm.fired = 0;
    storm.running = 1;
    return pthread_create(&storm.thread, NULL, storm_thread, NULL) == 0 ? 0 : RC_PARAM;
}

long dcmitest_storm_wait(void) {
    if (!storm.running) return -1;
    pthread_join(storm.thread, NULL);
    storm.running = 0;
    return storm.fired;
}

/* Monotonic ns when the event with this storm serial was fired (0 when unknown). */
long long dcmitest_storm_fire_ns(int serial_) {
    if (!storm.fire_ns || serial_ < 1 || serial_ > storm.cap) return 0;
    return storm.fire_ns[serial_ - 1];
}

#define SZ(s) \
    if (strcmp(name, #s) == 0) return (int)sizeof(struct s)
int dcmitest_sizeof(const char *name) {
    SZ(dcmi_dms_fault_event);
    SZ(dcmi_event);
    SZ(dcmi_event_filter);
    SZ(dcmi_spod_info);
    SZ(dcmi_proc_mem_info);
    SZ(dcmi_chip_info);
    return -1;
}

#define OFF(s, f) \
    if (strcmp(sname, #s) == 0 && strcmp(field, #f) == 0) return (int)offsetof(struct s, f)
int dcmitest_offsetof(const char *sname, const char *field) {
    OFF(dcmi_dms_fault_event, event_id);
    OFF(dcmi_dms_fault_event, deviceid);
    OFF(dcmi_dms_fault_event, node_type);
    OFF(dcmi_dms_fault_event, node_id);
    OFF(dcmi_dms_fault_event, sub_node_type);
    OFF(dcmi_dms_fault_event, sub_node_id);
    OFF(dcmi_dms_fault_event, severity);
    OFF(dcmi_dms_fault_event, assertion);
    OFF(dcmi_dms_fault_event, event_serial_num);
    OFF(dcmi_dms_fault_event, notify_serial_num);
    OFF(dcmi_dms_fault_event, alarm_raised_time);
    OFF(dcmi_dms_fault_event, event_name);
    OFF(dcmi_dms_fault_event, additional_info);
    OFF(dcmi_dms_fault_event, resv);
    OFF(dcmi_event, type);
    OFF(dcmi_event, event_t);
    OFF(dcmi_event_filter, filter_flag);
    OFF(dcmi_event_filter, event_id);
    OFF(dcmi_event_filter, severity);
    OFF(dcmi_event_filter, node_type);
    OFF(dcmi_event_filter, resv);
    OFF(dcmi_spod_info, super_pod_id);
    OFF(dcmi_spod_info, server_id);
    OFF(dcmi_spod_info, reserve);
    OFF(dcmi_proc_mem_info, proc_id);
    OFF(dcmi_proc_mem_info, proc_mem_usage);
    OFF(dcmi_chip_info, chip_name);
    OFF(dcmi_chip_info, aicore_cnt);
    return -1;
}

/* ---------------------------------------------------------------- DCMI API */

int dcmi_init(void) { return enter(func_index("dcmi_init"), -1); }

int dcmi_get_card_list(int *card_num, int *card_list, int list_len) {
    int rc = enter(func_index("dcmi_get_card_list"), -1);
    if (rc) return rc;
    if (!card_num || !card_list || list_len <= 0) return RC_PARAM;
    int n = n_cards < list_len ? n_cards : list_len;
    for (int i = 0; i < n; i++) card_list[i] = i;
    *card_num = n;
    return 0;
}

int dcmi_get_device_num_in_card(int card_id, int *device_num) {
    int rc = enter(func_index("dcmi_get_device_num_in_card"), -1);
    if (rc) return rc;
    if (card_id < 0 || card_id >= n_cards || !device_num) return RC_PARAM;
    *device_num = per_card;
    return 0;
}

int dcmi_get_device_logic_id(int *device_logic_id, int card_id, int device_id) {
    int logic = logic_of(card_id, device_id);
    int rc = enter(func_index("dcmi_get_device_logic_id"), logic);
    if (rc) return rc;
    if (logic < 0 || !device_logic_id) return RC_PARAM;
    *device_logic_id = logic;
    return 0;
}

int dcmi_get_device_phyid_from_logicid(unsigned int logicid, unsigned int *phyid) {
    int rc = enter(func_index("dcmi_get_device_phyid_from_logicid"), (int)logicid);
    if (rc) return rc;
    if ((int)logicid >= ndev() || !phyid) return RC_PARAM;
    *phyid = (unsigned int)devs[logicid].phy;
    return 0;
}

int dcmi_get_device_logicid_from_phyid(unsigned int phyid, unsigned int *logicid) {
    int rc = enter(func_index("dcmi_get_device_logicid_from_phyid"), -1);
    if (rc) return rc;
    for (int i = 0; i < ndev(); i++)
        if (devs[i].phy == (int)phyid) {
            *logicid = (unsigned int)i;
            return 0;
        }
    return RC_PARAM;
}

int dcmi_get_card_id_device_id_from_logicid(int *card_id, int *device_id, unsigned int device_logic_id) {
    int rc = enter(func_index("dcmi_get_card_id_device_id_from_logicid"), (int)device_logic_id);
    if (rc) return rc;
    if ((int)device_logic_id >= ndev() || !card_id || !device_id) return RC_PARAM;
    *card_id = (int)device_logic_id / per_card;
    *device_id = (int)device_logic_id % per_card;
    return 0;
}

int dcmi_get_device_health(int card_id, int device_id, unsigned int *health) {
    int logic = logic_of(card_id, device_id);
    int rc = enter(func_index("dcmi_get_device_health"), logic);
    if (rc) return rc;
    if (logic < 0 || !health) return RC_PARAM;
    pthread_mutex_lock(&mu);
    *health = devs[logic].ncodes > 0 ? 1u : devs[logic].health;
    pthread_mutex_unlock(&mu);
    return 0;
}

int dcmi_get_device_errorcode_v2(int card_id, int device_id, int *error_count, unsigned int *error_code_list,
                                 unsigned int list_len) {
    int logic = logic_of(card_id, device_id);
    int rc = enter(func_index("dcmi_get_device_errorcode_v2"), logic);
    if (rc) return rc;
    if (logic < 0 || !error_count || !error_code_list) return RC_PARAM;
    pthread_mutex_lock(&mu);
    int n = devs[logic].ncodes < (int)list_len ? devs[logic].ncodes : (int)list_len;
    memcpy(error_code_list, devs[logic].codes, sizeof(unsigned int) * n);
    *error_count = n;
    pthread_mutex_unlock(&mu);
    return 0;
}

int dcmi_subscribe_fault_event(int card_id, int device_id, struct dcmi_event_filter filter,
                               dcmi_fault_event_callback handler) {
    int rc = enter(func_index("dcmi_subscribe_fault_event"), -1);
    (void)filter;
    if (rc) return rc;
    if (card_id != -1 || device_id != -1 || !handler) return RC_PARAM;
    pthread_mutex_lock(&mu);
    callback = handler;
    pthread_mutex_unlock(&mu);
    return 0;
}

int dcmi_get_device_network_health(int card_id, int device_id, int *result) {
    int logic = logic_of(card_id, device_id);
    int rc = enter(func_index("dcmi_get_device_network_health"), logic);
    if (rc) return rc;
    if (logic < 0 || !result) return RC_PARAM;
    pthread_mutex_lock(&mu);
    *result = devs[logic].network;
    pthread_mutex_unlock(&mu);
    return 0;
}

int dcmi_get_device_boot_status(int card_id, int device_id, int *boot_status) {
    int logic = logic_of(card_id, device_id);
    int rc = enter(func_index("dcmi_get_device_boot_status"), logic);
    if (rc) return rc;
    if (logic < 0 || !boot_status) return RC_PARAM;
    pthread_mutex_lock(&mu);
    *boot_status = devs[logic].boot;
    pthread_mutex_unlock(&mu);
    return 0;
}

static void *boot_thread(void *p) {
    int logic = (int)(intptr_t)p;
    sleep_ms(reset_boot_ms);
    pthread_mutex_lock(&mu);
    devs[logic].boot = 16;
    pthread_mutex_unlock(&mu);
    return NULL;
}

/* A successful reset clears the chip's codes and boots it (status 16) reset_boot_ms later. */
int dcmi_set_device_reset(int card_id, int device_id, int channel) {
    int logic = logic_of(card_id, device_id);
    int rc = enter(func_index("dcmi_set_device_reset"), logic);
    pthread_t t;
    (void)channel;
    if (rc) return rc;
    if (logic < 0) return RC_PARAM;
    pthread_mutex_lock(&mu);
    devs[logic].resets++;
    devs[logic].ncodes = 0;
    devs[logic].health = 0;
    devs[logic].boot = 0;
    pthread_mutex_unlock(&mu);
    if (pthread_create(&t, NULL, boot_thread, (void *)(intptr_t)logic) == 0) pthread_detach(t);
    return 0;
}

int dcmi_pre_reset_soc(int card_id, int device_id) {
    return enter(func_index("dcmi_pre_reset_soc"), logic_of(card_id, device_id));
}

int dcmi_rescan_soc(int card_id, int device_id) {
    return enter(func_index("dcmi_rescan_soc"), logic_of(card_id, device_id));
}

int dcmi_get_device_outband_channel_state(int card_id, int device_id, int *state) {
    int rc = enter(func_index("dcmi_get_device_outband_channel_state"), logic_of(card_id, device_id));
    if (rc) return rc;
    *state = 1;
    return 0;
}

int dcmi_get_device_resource_info(int card_id, int device_id, struct dcmi_proc_mem_info *proc_info,
                                  int *proc_num) {
    int logic = logic_of(card_id, device_id);
    int rc = enter(func_index("dcmi_get_device_resource_info"), logic);
    if (rc) return rc;
    if (logic < 0 || !proc_info || !proc_num) return RC_PARAM;
    pthread_mutex_lock(&mu);
    int n = devs[logic].procs < 32 ? devs[logic].procs : 32;
    for (int i = 0; i < n; i++) {
        proc_info[i].proc_id = 1000 + i;
        proc_info[i].proc_mem_usage = 1UL << 20;
    }
    *proc_num = n;
    pthread_mutex_unlock(&mu);
    return 0;
}

int dcmi_get_device_info(int card_id, int device_id, int main_cmd, unsigned int sub_cmd, void *buf,
                         unsigned int *size) {
    int logic = logic_of(card_id, device_id);
    int rc = enter(func_index("dcmi_get_device_info"), logic);
    if (rc) return rc;
    if (logic < 0 || !buf || !size) return RC_PARAM;
    if (main_cmd == 12 && sub_cmd == 1 && *size >= sizeof(struct dcmi_spod_info)) {
        struct dcmi_spod_info *s = buf;
        memset(s, 0, sizeof *s);
        s->sdid = (unsigned int)logic;
        s->super_pod_id = 0xffffffffu;
        s->server_id = 0xffffffffu;
        *size = sizeof *s;
        return 0;
    }
    return -8255;
}

int dcmi_get_netdev_brother_device(int card_id, int device_id, int *brother_card_id) {
    int rc = enter(func_index("dcmi_get_netdev_brother_device"), logic_of(card_id, device_id));
    if (rc) return rc;
    *brother_card_id = card_id ^ 1;
    return 0;
}

int dcmi_get_device_chip_info(int card_id, int device_id, struct dcmi_chip_info *chip_info) {
    int logic = logic_of(card_id, device_id);
    int rc = enter(func_index("dcmi_get_device_chip_info"), logic);
    if (rc) return rc;
    if (logic < 0 || !chip_info) return RC_PARAM;
    memset(chip_info, 0, sizeof *chip_info);
    strcpy((char *)chip_info->chip_type, "Ascend");
    pthread_mutex_lock(&mu);
    strcpy((char *)chip_info->chip_name, chip_name);
    pthread_mutex_unlock(&mu);
    strcpy((char *)chip_info->chip_ver, "V1");
    chip_info->aicore_cnt = 24;
    return 0;
}

__attribute__((constructor)) static void init_defaults(void) { dcmitest_reset(1, 8); }

/* ---------------------------------------------------------------- DCMI v2 (dev id = logic id) */

static int card_dev(int dev_id, int *card, int *dev) {
    if (dev_id < 0 || dev_id >= ndev()) return RC_PARAM;
    *card = dev_id / per_card;
    *dev = dev_id % per_card;
    return 0;
}

int dcmiv2_init(void) { return dcmi_init(); }

int dcmiv2_get_device_list(int *device_list, int *device_num, int list_len) {
    int rc = enter(func_index("dcmi_get_card_list"), -1);
    if (rc) return rc;
    if (!device_list || !device_num || list_len <= 0) return RC_PARAM;
    int n = ndev() < list_len ? ndev() : list_len;
    for (int i = 0; i < n; i++) device_list[i] = i;
    *device_num = n;
    return 0;
}

int dcmiv2_get_chip_phy_id_by_dev_id(unsigned int dev_id, unsigned int *phyid) {
    return dcmi_get_device_phyid_from_logicid(dev_id, phyid);
}

int dcmiv2_get_device_health(int dev_id, unsigned int *health) {
    int c, d;
    if (card_dev(dev_id, &c, &d)) return RC_PARAM;
    return dcmi_get_device_health(c, d, health);
}

int dcmiv2_get_device_error_code_list(int dev_id, int *error_count, unsigned int *list, unsigned int len) {
    int c, d;
    if (card_dev(dev_id, &c, &d)) return RC_PARAM;
    return dcmi_get_device_errorcode_v2(c, d, error_count, list, len);
}

int dcmiv2_subscribe_fault_event(int dev_id, struct dcmi_event_filter filter, dcmi_fault_event_callback handler) {
    if (dev_id != -1) return RC_PARAM;
    return dcmi_subscribe_fault_event(-1, -1, filter, handler);
}

int dcmiv2_get_device_network_health(int dev_id, int *result) {
    int c, d;
    if (card_dev(dev_id, &c, &d)) return RC_PARAM;
    return dcmi_get_device_network_health(c, d, result);
}

int dcmiv2_get_device_boot_status(int dev_id, int *status) {
    int c, d;
    if (card_dev(dev_id, &c, &d)) return RC_PARAM;
    return dcmi_get_device_boot_status(c, d, status);
}

int dcmiv2_reset_device(int dev_id, int channel) {
    int c, d;
    if (card_dev(dev_id, &c, &d)) return RC_PARAM;
    return dcmi_set_device_reset(c, d, channel);
}

int dcmiv2_get_device_proc_mem_info(int dev_id, struct dcmi_proc_mem_info *proc_info, int *proc_num) {
    int c, d;
    if (card_dev(dev_id, &c, &d)) return RC_PARAM;
    return dcmi_get_device_resource_info(c, d, proc_info, proc_num);
}
