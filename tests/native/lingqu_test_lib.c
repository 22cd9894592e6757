/*
 * A test double of the lingqu switch library (liblingqu-dcmi.so) for faultmesh's tests.
 * Exports lq_dcmi_init, lq_dcmi_subscribe_fault_event(filter, handler), lq_dcmi_get_fault_info, and
 * a control API prefixed "lqtest_":
 *   lqtest_reset()                              clear faults and the subscription
 *   lqtest_fire(type, fault_id, peer_dev, peer_port, chip, port, severity, assertion, wait)
 *                                              update the current list and fire the callback from a
 *                                              new C thread (join when wait); -1 when not subscribed
 *   lqtest_set_rc(name, rc) / lqtest_calls(name) / lqtest_sizeof(name) / lqtest_offsetof(s, f)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct LqDcmiEvent {
    int eventType;
    unsigned int subType;
    unsigned short peerportDevice;
    unsigned short peerportId;
    unsigned short switchChipid;
    unsigned short switchPortid;
    unsigned char severity;
    unsigned char assertion;
    char res[6];
    unsigned int eventSerialNum;
    unsigned int notifySerialNum;
    unsigned long alarmRaisedTime;
    unsigned char additionalParam[40];
    char additionalInfo[32];
} LqDcmiEvent;

typedef struct lq_dcmi_event_filter {
    int filterFlag;
    int eventTypeId;
    unsigned int eventId;
    unsigned char severity;
    unsigned int chipId;
} LqDcmiEventFilter;

typedef void (*LqDcmiFaultEventCallback)(struct LqDcmiEvent *event);

#define MAXF 256
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static LqDcmiEvent faults[MAXF];
static int nfaults;
static LqDcmiFaultEventCallback cb;
static unsigned int serial;
static int rc_init, rc_sub, rc_info;
static long calls_init, calls_sub, calls_info;

void lqtest_reset(void) {
    pthread_mutex_lock(&mu);
    nfaults = 0;
    cb = NULL;
    serial = 0;
    rc_init = rc_sub = rc_info = 0;
    calls_init = calls_sub = calls_info = 0;
    pthread_mutex_unlock(&mu);
}

int lqtest_set_rc(const char *name, int rc) {
    pthread_mutex_lock(&mu);
    if (!strcmp(name, "lq_dcmi_init")) rc_init = rc;
    else if (!strcmp(name, "lq_dcmi_subscribe_fault_event")) rc_sub = rc;
    else if (!strcmp(name, "lq_dcmi_get_fault_info")) rc_info = rc;
    else {
        pthread_mutex_unlock(&mu);
        return -1;
    }
    pthread_mutex_unlock(&mu);
    return 0;
}

long lqtest_calls(const char *name) {
    if (!strcmp(name, "lq_dcmi_init")) return calls_init;
    if (!strcmp(name, "lq_dcmi_subscribe_fault_event")) return calls_sub;
    if (!strcmp(name, "lq_dcmi_get_fault_info")) return calls_info;
    return -1;
}

static int same(const LqDcmiEvent *a, const LqDcmiEvent *b) {
    return a->eventType == b->eventType && a->subType == b->subType && a->peerportDevice == b->peerportDevice &&
           a->peerportId == b->peerportId && a->switchChipid == b->switchChipid && a->switchPortid == b->switchPortid;
}

struct fire_arg {
    LqDcmiEvent ev;
    LqDcmiFaultEventCallback cb;
};

static void *fire_thread(void *p) {
    struct fire_arg *a = p;
    a->cb(&a->ev);
    free(a);
    return NULL;
}

int lqtest_fire(int type, unsigned int fault_id, int peer_dev, int peer_port, int chip, int port, int severity,
                int assertion, int wait) {
    LqDcmiEvent ev;
    pthread_t t;
    memset(&ev, 0, sizeof ev);
    ev.eventType = type;
    ev.subType = fault_id;
    ev.peerportDevice = (unsigned short)peer_dev;
    ev.peerportId = (unsigned short)peer_port;
    ev.switchChipid = (unsigned short)chip;
    ev.switchPortid = (unsigned short)port;
    ev.severity = (unsigned char)severity;
    ev.assertion = (unsigned char)assertion;
    ev.alarmRaisedTime = 0;
    pthread_mutex_lock(&mu);
    ev.eventSerialNum = ++serial;
    int at = -1;
    for (int i = 0; i < nfaults; i++)
        if (same(&faults[i], &ev)) at = i;
    if (assertion == 1 && at < 0 && nfaults < MAXF) faults[nfaults++] = ev;
    if (assertion == 0 && at >= 0) faults[at] = faults[--nfaults];
    LqDcmiFaultEventCallback c = cb;
    pthread_mutex_unlock(&mu);
    if (!c) return -1;
    struct fire_arg *a = malloc(sizeof *a);
    a->ev = ev;
    a->cb = c;
    if (pthread_create(&t, NULL, fire_thread, a) != 0) {
        free(a);
        return -2;
    }
    if (wait) pthread_join(t, NULL);
    else pthread_detach(t);
    return 0;
}

int lqtest_sizeof(const char *name) {
    if (!strcmp(name, "LqDcmiEvent")) return (int)sizeof(LqDcmiEvent);
    if (!strcmp(name, "lq_dcmi_event_filter")) return (int)sizeof(LqDcmiEventFilter);
    return -1;
}

#define OFF(T, s, f) \
    if (!strcmp(sname, s) && !strcmp(field, #f)) return (int)offsetof(T, f)
int lqtest_offsetof(const char *sname, const char *field) {
    OFF(LqDcmiEvent, "LqDcmiEvent", eventType);
    OFF(LqDcmiEvent, "LqDcmiEvent", subType);
    OFF(LqDcmiEvent, "LqDcmiEvent", switchPortid);
    OFF(LqDcmiEvent, "LqDcmiEvent", severity);
    OFF(LqDcmiEvent, "LqDcmiEvent", assertion);
    OFF(LqDcmiEvent, "LqDcmiEvent", eventSerialNum);
    OFF(LqDcmiEvent, "LqDcmiEvent", alarmRaisedTime);
    OFF(LqDcmiEvent, "LqDcmiEvent", additionalParam);
    OFF(LqDcmiEvent, "LqDcmiEvent", additionalInfo);
    OFF(LqDcmiEventFilter, "lq_dcmi_event_filter", severity);
    OFF(LqDcmiEventFilter, "lq_dcmi_event_filter", chipId);
    return -1;
}

int lq_dcmi_init(void) {
    pthread_mutex_lock(&mu);
    calls_init++;
    int rc = rc_init;
    pthread_mutex_unlock(&mu);
    return rc;
}

int lq_dcmi_subscribe_fault_event(LqDcmiEventFilter filter, LqDcmiFaultEventCallback handler) {
    (void)filter;
    pthread_mutex_lock(&mu);
    calls_sub++;
    int rc = rc_sub;
    if (rc == 0) cb = handler;
    pthread_mutex_unlock(&mu);
    return rc;
}

int lq_dcmi_get_fault_info(unsigned int listLen, unsigned int *eventListLen, LqDcmiEvent *eventList) {
    pthread_mutex_lock(&mu);
    calls_info++;
    int rc = rc_info;
    if (rc == 0) {
        unsigned int n = (unsigned int)nfaults < listLen ? (unsigned int)nfaults : listLen;
        memcpy(eventList, faults, n * sizeof(LqDcmiEvent));
        *eventListLen = n;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}
