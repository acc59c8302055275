/*
 * limiter._speedups: the hot path of LocalLimiter.check in C.
 *
 * Only the common case is handled here: a str key already in the map, a token
 * bucket policy, an int cost within the limit or a Charge of at most MAX_COST
 * units either way (limiter/charges.py's charge_token_bucket: counted whatever is
 * left, into debt), and a 64-bit timestamp. Anything
 * else (a new key, eviction, another algorithm, bad input) goes to the
 * pure-Python LocalLimiter._check_py, which stays the reference implementation.
 *
 * The arithmetic is limiter/algorithms.py's token_bucket (and lua/token_bucket.lua)
 * operation for operation in IEEE-754 doubles; it is compiled with
 * -ffp-contract=off so no multiply-add is fused and the answers stay bit-identical
 * (tests/test_differential.py runs this path against the pure function and Redis).
 *
 * Concurrency: the Python paths hold LocalLimiter._lock for their whole
 * read-modify-write. This path runs holding the GIL and calls no Python code
 * between reading a key's state and writing the new one, except allocations,
 * which can run a garbage collection and so a finalizer that lets another thread
 * in. So every object is allocated first; then, with no allocation left, the path
 * checks that the lock is free and that the key still maps to the same entry
 * holding the same state (compare-and-swap), and only then writes. If anything
 * moved, it starts again (a few times, then takes the locked Python path).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define EPSILON 1e-9
/* a key's entry: [state, algorithm, last_seen_us, expires_us, function, (created_us, forgot_us)] */
#define ENTRY_SIZE 6
#define MAX_RETRIES 3
/* beyond this a wait in microseconds is handed to the Python path (big ints) */
#define MAX_SAFE_US 4.0e18
/* limiter.policy.MAX_COST and limiter.charges' MAX_DEBT and MAX_DEBT_US (tests compare them) */
#define MAX_COST 1000000000LL
#define MAX_DEBT 4503599627370496.0
#define MAX_DEBT_US 315360000000000.0

typedef struct {
    PyObject_HEAD
    PyObject *data;        /* the OrderedDict: key -> an entry of ENTRY_SIZE items (LocalLimiter._data) */
    PyObject *locked;      /* bound lock.locked */
    PyObject *move_to_end; /* bound data.move_to_end */
    PyObject *slow;        /* LocalLimiter._check_py(key, policy, cost, now_us) */
    PyObject *clock;       /* None: CLOCK_REALTIME, as time.time_ns() // 1000 */
    PyObject *decision_type;
    PyObject *token_bucket_alg; /* Algorithm.TOKEN_BUCKET: its pure function is algorithms.token_bucket */
    PyObject *charge_type; /* limiter.policy.Charge, or None: a cost of this type is a charge */
    Py_ssize_t off_allowed, off_remaining, off_limit, off_retry, off_reset;
    /* the last policy seen, by identity (Policy is frozen; the reference keeps it alive) */
    PyObject *policy;
    PyObject *policy_limit;
    double burst, rate;
    long long limit, ttl_us;
    int policy_fast;
    uint64_t fast_hits, slow_calls;
    vectorcallfunc vectorcall;
} FastCheck;

static PyObject *one; /* the default cost */
static PyObject *str_algorithm, *str_burst_f, *str_rate_per_us, *str_limit, *str_ttl_us, *str_cost, *str_now_us;

static int
member_offset(PyObject *type, const char *name, Py_ssize_t *out)
{
    PyObject *d = PyObject_GetAttrString(type, "__dict__");
    if (d == NULL)
        return -1;
    PyObject *descr = PyMapping_GetItemString(d, name);
    Py_DECREF(d);
    if (descr == NULL)
        return -1;
    if (!Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        Py_DECREF(descr);
        PyErr_Format(PyExc_TypeError, "decision type: field %s is not a slot", name);
        return -1;
    }
    PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
    if (m->type != T_OBJECT_EX && m->type != T_OBJECT) {
        Py_DECREF(descr);
        PyErr_Format(PyExc_TypeError, "decision type: field %s is not an object slot", name);
        return -1;
    }
    *out = m->offset;
    Py_DECREF(descr);
    return 0;
}

static int
FastCheck_init(FastCheck *self, PyObject *args, PyObject *kwds)
{
    PyObject *data, *lock, *slow, *clock, *decision_type, *alg, *charge_type = Py_None;
    static char *kwlist[] = {"data", "lock", "slow", "clock", "decision_type", "token_bucket_alg", "charge_type", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOO|$O", kwlist, &data, &lock, &slow, &clock, &decision_type, &alg, &charge_type))
        return -1;
    if (charge_type != Py_None && !(PyType_Check(charge_type) && PyType_IsSubtype((PyTypeObject *)charge_type, &PyLong_Type))) {
        PyErr_SetString(PyExc_TypeError, "charge_type: must be None or a subclass of int");
        return -1;
    }
    if (!PyDict_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "data: must be a dict (an OrderedDict)");
        return -1;
    }
    if (!PyType_Check(decision_type)) {
        PyErr_SetString(PyExc_TypeError, "decision_type: must be a type");
        return -1;
    }
    if (!PyCallable_Check(slow) || (clock != Py_None && !PyCallable_Check(clock))) {
        PyErr_SetString(PyExc_TypeError, "slow and clock: must be callable");
        return -1;
    }
    if (member_offset(decision_type, "allowed", &self->off_allowed) < 0 ||
        member_offset(decision_type, "remaining", &self->off_remaining) < 0 ||
        member_offset(decision_type, "limit", &self->off_limit) < 0 ||
        member_offset(decision_type, "retry_after_us", &self->off_retry) < 0 ||
        member_offset(decision_type, "reset_after_us", &self->off_reset) < 0)
        return -1;
    PyObject *locked = PyObject_GetAttrString(lock, "locked");
    if (locked == NULL)
        return -1;
    PyObject *mte = PyObject_GetAttrString(data, "move_to_end");
    if (mte == NULL) {
        Py_DECREF(locked);
        return -1;
    }
    Py_XSETREF(self->locked, locked);
    Py_XSETREF(self->move_to_end, mte);
    Py_INCREF(data);
    Py_XSETREF(self->data, data);
    Py_INCREF(slow);
    Py_XSETREF(self->slow, slow);
    Py_INCREF(clock);
    Py_XSETREF(self->clock, clock);
    Py_INCREF(decision_type);
    Py_XSETREF(self->decision_type, decision_type);
    Py_INCREF(alg);
    Py_XSETREF(self->token_bucket_alg, alg);
    Py_INCREF(charge_type);
    Py_XSETREF(self->charge_type, charge_type);
    Py_CLEAR(self->policy);
    Py_CLEAR(self->policy_limit);
    return 0;
}

static int
FastCheck_traverse(FastCheck *self, visitproc visit, void *arg)
{
    Py_VISIT(self->data);
    Py_VISIT(self->locked);
    Py_VISIT(self->move_to_end);
    Py_VISIT(self->slow);
    Py_VISIT(self->clock);
    Py_VISIT(self->decision_type);
    Py_VISIT(self->token_bucket_alg);
    Py_VISIT(self->charge_type);
    Py_VISIT(self->policy);
    Py_VISIT(self->policy_limit);
    return 0;
}

static int
FastCheck_clear(FastCheck *self)
{
    Py_CLEAR(self->data);
    Py_CLEAR(self->locked);
    Py_CLEAR(self->move_to_end);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->decision_type);
    Py_CLEAR(self->token_bucket_alg);
    Py_CLEAR(self->charge_type);
    Py_CLEAR(self->policy);
    Py_CLEAR(self->policy_limit);
    return 0;
}

static void
FastCheck_dealloc(FastCheck *self)
{
    PyObject_GC_UnTrack(self);
    FastCheck_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Read the derived fields of a Policy once per policy object. Returns 1 when the
 * policy can take the fast path, 0 when not, -1 on error. */
static int
load_policy(FastCheck *self, PyObject *policy)
{
    if (policy == self->policy)
        return self->policy_fast;
    int fast = 0;
    PyObject *alg = NULL, *burst = NULL, *rate = NULL, *limit = NULL, *ttl = NULL;
    alg = PyObject_GetAttr(policy, str_algorithm);
    if (alg == NULL)
        goto done;
    /* an unlimited policy has rate 0 and is left to the Python path (r > 0.0 below) */
    if (alg == self->token_bucket_alg) {
        burst = PyObject_GetAttr(policy, str_burst_f);
        rate = burst ? PyObject_GetAttr(policy, str_rate_per_us) : NULL;
        limit = rate ? PyObject_GetAttr(policy, str_limit) : NULL;
        ttl = limit ? PyObject_GetAttr(policy, str_ttl_us) : NULL;
        if (ttl == NULL)
            goto done;
        if (PyFloat_CheckExact(burst) && PyFloat_CheckExact(rate) && PyLong_CheckExact(limit) && PyLong_CheckExact(ttl)) {
            int o1 = 0, o2 = 0;
            long long lim = PyLong_AsLongLongAndOverflow(limit, &o1);
            long long t = PyLong_AsLongLongAndOverflow(ttl, &o2);
            double r = PyFloat_AS_DOUBLE(rate);
            if (!o1 && !o2 && lim >= 1 && t >= 0 && t < (1LL << 60) && r > 0.0) {
                self->burst = PyFloat_AS_DOUBLE(burst);
                self->rate = r;
                self->limit = lim;
                self->ttl_us = t;
                fast = 1;
            }
        }
    }
done:
    /* a policy without these attributes is the Python path's to reject */
    PyErr_Clear();
    Py_XDECREF(alg);
    Py_XDECREF(burst);
    Py_XDECREF(rate);
    Py_XDECREF(ttl);
    if (!fast)
        Py_CLEAR(limit);
    Py_INCREF(policy);
    Py_XSETREF(self->policy, policy);
    Py_XSETREF(self->policy_limit, limit); /* steals (may be NULL) */
    self->policy_fast = fast;
    return fast;
}

static PyObject *
call_slow(FastCheck *self, PyObject *key, PyObject *policy, PyObject *cost, PyObject *now)
{
    self->slow_calls++;
    PyObject *args[4] = {key, policy, cost, now};
    return PyObject_Vectorcall(self->slow, args, 4, NULL);
}

static inline int
set_item(PyObject *list, Py_ssize_t i, PyObject *value) /* steals value */
{
    PyObject *old = PyList_GET_ITEM(list, i);
    PyList_SET_ITEM(list, i, value);
    Py_DECREF(old);
    return 0;
}

/* check(key, policy, cost=1, now_us=None) -> Decision */
static PyObject *
FastCheck_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    FastCheck *self = (FastCheck *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *key = NULL, *policy = NULL, *cost = NULL, *now = NULL;
    if (nargs > 4) {
        PyErr_Format(PyExc_TypeError, "check() takes at most 4 arguments (%zd given)", nargs);
        return NULL;
    }
    if (nargs > 0) key = args[0];
    if (nargs > 1) policy = args[1];
    if (nargs > 2) cost = args[2];
    if (nargs > 3) now = args[3];
    if (kwnames != NULL) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t i = 0; i < nk; i++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, i);
            PyObject *v = args[nargs + i];
            PyObject **slot;
            if (PyUnicode_Compare(name, str_cost) == 0) slot = &cost;
            else if (PyUnicode_Compare(name, str_now_us) == 0) slot = &now;
            else if (PyUnicode_CompareWithASCIIString(name, "key") == 0) slot = &key;
            else if (PyUnicode_CompareWithASCIIString(name, "policy") == 0) slot = &policy;
            else {
                PyErr_Format(PyExc_TypeError, "check() got an unexpected keyword argument '%U'", name);
                return NULL;
            }
            if (*slot != NULL) {
                PyErr_Format(PyExc_TypeError, "check() got multiple values for argument '%U'", name);
                return NULL;
            }
            *slot = v;
        }
    }
    if (key == NULL || policy == NULL) {
        PyErr_SetString(PyExc_TypeError, "check() missing required argument: 'key' and 'policy'");
        return NULL;
    }
    if (cost == NULL)
        cost = one;

    /* the clock, read once; the slow path gets the same timestamp */
    long long now_us;
    PyObject *now_obj = NULL; /* owned */
    if (now == NULL || now == Py_None) {
        if (self->clock == Py_None) {
            struct timespec ts;
            if (clock_gettime(CLOCK_REALTIME, &ts) != 0) {
                PyErr_SetFromErrno(PyExc_OSError);
                return NULL;
            }
            now_us = (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
            now_obj = PyLong_FromLongLong(now_us);
            if (now_obj == NULL)
                return NULL;
        }
        else {
            now_obj = PyObject_CallNoArgs(self->clock);
            if (now_obj == NULL)
                return NULL;
            if (!PyLong_CheckExact(now_obj)) {
                PyObject *r = call_slow(self, key, policy, cost, now_obj);
                Py_DECREF(now_obj);
                return r;
            }
            int of = 0;
            now_us = PyLong_AsLongLongAndOverflow(now_obj, &of);
            if (of || now_us < 0 || now_us > (1LL << 60)) {
                PyObject *r = call_slow(self, key, policy, cost, now_obj);
                Py_DECREF(now_obj);
                return r;
            }
        }
    }
    else {
        int of = 0;
        if (!PyLong_CheckExact(now) || (now_us = PyLong_AsLongLongAndOverflow(now, &of), of) || now_us < 0 || now_us > (1LL << 60))
            return call_slow(self, key, policy, cost, now);
        Py_INCREF(now);
        now_obj = now;
    }

#define SLOW() do { PyObject *r_ = call_slow(self, key, policy, cost, now_obj); Py_DECREF(now_obj); return r_; } while (0)

    /* a charge: an instance of exactly the charge type (a subclass of it is the Python path's) */
    const int charge = !PyLong_CheckExact(cost) && self->charge_type != Py_None && self->charge_type != NULL &&
                       Py_IS_TYPE(cost, (PyTypeObject *)self->charge_type);
    if (!PyUnicode_CheckExact(key) || !(charge || PyLong_CheckExact(cost)))
        SLOW();
    int fast = load_policy(self, policy);
    if (fast < 0) {
        Py_DECREF(now_obj);
        return NULL;
    }
    if (!fast)
        SLOW();
    int of = 0;
    long long c = PyLong_AsLongLongAndOverflow(cost, &of);
    if (of || (charge ? (c < -MAX_COST || c > MAX_COST) : (c < 1 || c > self->limit)))
        SLOW();

    const double burst = self->burst, rate = self->rate, dcost = (double)c;
    for (int attempt = 0; attempt < MAX_RETRIES; attempt++) {
        PyObject *entry = PyDict_GetItemWithError(self->data, key); /* borrowed */
        if (entry == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(now_obj);
                return NULL;
            }
            SLOW(); /* a new key: insertion, sweep and eviction are the Python path's */
        }
        if (!PyList_CheckExact(entry) || PyList_GET_SIZE(entry) != ENTRY_SIZE || PyList_GET_ITEM(entry, 1) != self->token_bucket_alg)
            SLOW();
        PyObject *state = PyList_GET_ITEM(entry, 0);
        if (!PyTuple_CheckExact(state) || PyTuple_GET_SIZE(state) != 2)
            SLOW();
        PyObject *last_obj = PyTuple_GET_ITEM(state, 0), *tokens_obj = PyTuple_GET_ITEM(state, 1);
        if (!PyLong_CheckExact(last_obj) || !PyFloat_CheckExact(tokens_obj))
            SLOW();
        of = 0;
        long long last = PyLong_AsLongLongAndOverflow(last_obj, &of);
        if (of || last > (1LL << 60) || last < -(1LL << 60))
            SLOW();
        Py_INCREF(entry);
        Py_INCREF(state);
        Py_INCREF(last_obj);

        /* algorithms.token_bucket, step by step */
        double tokens = PyFloat_AS_DOUBLE(tokens_obj);
        int advanced = 0;
        if (now_us > last) {
            double t = tokens + (double)(now_us - last) * rate;
            tokens = (t < burst) ? t : burst; /* min(burst, t) */
            advanced = 1;
        }
        int allowed;
        double remaining_d, retry_d = 0.0, reset_d;
        if (charge) {
            /* charges.charge_token_bucket: counted whatever is left, the state always written */
            allowed = tokens >= dcost;
            tokens = tokens - dcost;
            if (tokens > burst)
                tokens = burst;
            const double max_debt = (MAX_DEBT < rate * MAX_DEBT_US) ? MAX_DEBT : rate * MAX_DEBT_US;
            if (tokens < -max_debt)
                tokens = -max_debt;
            reset_d = (tokens >= burst) ? 0.0 : ceil((burst - tokens) / rate);
            retry_d = (tokens >= 1.0) ? 0.0 : ceil((1.0 - tokens) / rate);
        }
        else if (tokens >= dcost) {
            allowed = 1;
            tokens = tokens - dcost;
            reset_d = (tokens >= burst) ? 0.0 : ceil((burst - tokens) / rate);
        }
        else {
            allowed = 0;
            retry_d = ceil((dcost - tokens) / rate);
            reset_d = (tokens >= burst) ? 0.0 : ceil((burst - tokens) / rate);
        }
        remaining_d = floor(tokens + EPSILON);

        PyObject *dec = NULL, *new_state = NULL, *new_tokens = NULL, *expires = NULL;
        PyObject *remaining = NULL, *retry = NULL, *reset = NULL;
        if (!(reset_d < MAX_SAFE_US) || !(retry_d < MAX_SAFE_US) || now_us + self->ttl_us + (long long)reset_d < 0) {
            Py_DECREF(entry);
            Py_DECREF(state);
            Py_DECREF(last_obj);
            SLOW();
        }
        long long exp_us = now_us + self->ttl_us + (long long)reset_d;

        /* allocate everything first */
        remaining = PyLong_FromDouble(remaining_d);
        retry = PyLong_FromDouble(retry_d);
        reset = PyLong_FromDouble(reset_d);
        expires = PyLong_FromLongLong(exp_us);
        const int write = allowed || charge; /* a denied request leaves the state as it was */
        if (write) {
            new_tokens = PyFloat_FromDouble(tokens);
            new_state = PyTuple_New(2);
        }
        PyTypeObject *dt = (PyTypeObject *)self->decision_type;
        dec = dt->tp_alloc(dt, 0);
        if (remaining == NULL || retry == NULL || reset == NULL || expires == NULL || dec == NULL ||
            (write && (new_tokens == NULL || new_state == NULL))) {
            Py_XDECREF(remaining);
            Py_XDECREF(retry);
            Py_XDECREF(reset);
            Py_XDECREF(expires);
            Py_XDECREF(new_tokens);
            Py_XDECREF(new_state);
            Py_XDECREF(dec);
            Py_DECREF(entry);
            Py_DECREF(state);
            Py_DECREF(last_obj);
            Py_DECREF(now_obj);
            return NULL;
        }
        /* fill the decision (its slots are zeroed by tp_alloc) */
        char *base = (char *)dec;
        PyObject *b = allowed ? Py_True : Py_False;
        Py_INCREF(b);
        *(PyObject **)(base + self->off_allowed) = b;
        *(PyObject **)(base + self->off_remaining) = remaining;
        Py_INCREF(self->policy_limit);
        *(PyObject **)(base + self->off_limit) = self->policy_limit;
        *(PyObject **)(base + self->off_retry) = retry;
        *(PyObject **)(base + self->off_reset) = reset;
        if (write) {
            PyObject *l = advanced ? now_obj : last_obj;
            Py_INCREF(l);
            PyTuple_SET_ITEM(new_state, 0, l);
            PyTuple_SET_ITEM(new_state, 1, new_tokens);
        }

        /* no allocation from here to the writes: check that nothing moved */
        int busy;
        PyObject *lk = PyObject_CallNoArgs(self->locked);
        if (lk == NULL)
            busy = -1;
        else {
            busy = PyObject_IsTrue(lk);
            Py_DECREF(lk);
        }
        PyObject *again = (busy == 0) ? PyDict_GetItemWithError(self->data, key) : NULL;
        int moved = busy != 0 || again != entry || PyList_GET_SIZE(entry) != ENTRY_SIZE || PyList_GET_ITEM(entry, 0) != state;
        if (moved || PyErr_Occurred()) {
            Py_DECREF(dec);
            Py_XDECREF(new_state);
            Py_DECREF(expires);
            Py_DECREF(entry);
            Py_DECREF(state);
            Py_DECREF(last_obj);
            if (PyErr_Occurred()) {
                Py_DECREF(now_obj);
                return NULL;
            }
            if (busy)
                SLOW(); /* a locked Python path is running: queue behind it */
            continue;
        }
        /* write: entry = [state, algorithm, last_seen_us, expires_us, function, (created_us, forgot_us)];
           algorithm, function and the bucket's birth stay */
        if (write)
            set_item(entry, 0, new_state);
        Py_INCREF(now_obj);
        set_item(entry, 2, now_obj);
        PyObject *cur_exp = PyList_GET_ITEM(entry, 3);
        int oe = 0;
        long long cur = PyLong_CheckExact(cur_exp) ? PyLong_AsLongLongAndOverflow(cur_exp, &oe) : 0;
        /* expires only moves later (oe > 0: the stored one is beyond 64 bits, so later) */
        if (!PyLong_CheckExact(cur_exp) || oe < 0 || (oe == 0 && exp_us > cur))
            set_item(entry, 3, expires);
        else
            Py_DECREF(expires);
        Py_DECREF(entry);
        Py_DECREF(state);
        Py_DECREF(last_obj);
        Py_DECREF(now_obj);
        /* least recently used order: the key is now the most recent */
        PyObject *r = PyObject_CallOneArg(self->move_to_end, key);
        if (r == NULL) {
            Py_DECREF(dec);
            return NULL;
        }
        Py_DECREF(r);
        self->fast_hits++;
        return dec;
    }
    SLOW();
#undef SLOW
}

static PyObject *
FastCheck_stats(FastCheck *self, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("{s:K,s:K}", "fast", (unsigned long long)self->fast_hits, "slow", (unsigned long long)self->slow_calls);
}

static PyObject *
FastCheck_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    FastCheck *self = (FastCheck *)type->tp_alloc(type, 0);
    if (self != NULL)
        self->vectorcall = FastCheck_vectorcall;
    return (PyObject *)self;
}

static PyMethodDef FastCheck_methods[] = {
    {"stats", (PyCFunction)FastCheck_stats, METH_NOARGS, "How many checks took the C path and how many the Python one."},
    {NULL}};

static PyTypeObject FastCheckType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "limiter._speedups.FastCheck",
    .tp_doc = PyDoc_STR("check(key, policy, cost=1, now_us=None) -> Decision, token bucket hot path in C"),
    .tp_basicsize = sizeof(FastCheck),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = FastCheck_new,
    .tp_init = (initproc)FastCheck_init,
    .tp_dealloc = (destructor)FastCheck_dealloc,
    .tp_traverse = (traverseproc)FastCheck_traverse,
    .tp_clear = (inquiry)FastCheck_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(FastCheck, vectorcall),
    .tp_methods = FastCheck_methods,
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "limiter._speedups",
    .m_doc = "C hot path for LocalLimiter.check (token bucket); the Python code stays the reference.",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
#define INTERN(var, s) if ((var = PyUnicode_InternFromString(s)) == NULL) return NULL
    INTERN(str_algorithm, "algorithm");
    INTERN(str_burst_f, "burst_f");
    INTERN(str_rate_per_us, "rate_per_us");
    INTERN(str_limit, "limit");
    INTERN(str_ttl_us, "ttl_us");
    INTERN(str_cost, "cost");
    INTERN(str_now_us, "now_us");
#undef INTERN
    if ((one = PyLong_FromLong(1)) == NULL)
        return NULL;
    if (PyType_Ready(&FastCheckType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&speedups_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&FastCheckType);
    if (PyModule_AddObject(m, "FastCheck", (PyObject *)&FastCheckType) < 0) {
        Py_DECREF(&FastCheckType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "MAX_COST", (long)MAX_COST) < 0 ||
        PyModule_AddObject(m, "MAX_DEBT", PyFloat_FromDouble(MAX_DEBT)) < 0 ||
        PyModule_AddObject(m, "MAX_DEBT_US", PyFloat_FromDouble(MAX_DEBT_US)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
