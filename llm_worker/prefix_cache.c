/* prefix_cache.c - the radix tree of cached prefixes (see prefix_cache.h).
 *
 * Invariants: a node's children start with different keys; a node's refs
 * is the number of locked paths through it (so a parent's refs is at least
 * each child's); `tokens` is the sum of every node's length and `locked`
 * the sum over nodes with refs > 0; `locks` counts the locked paths. With
 * blocks tracked, a node at depth d of length len holds the hashes of the
 * blocks ending in it: those whose end (i + 1) * B is in (d, d + len],
 * (d + len) / B - d / B of them; `blocks` is their sum over nodes. */
#include "prefix_cache.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

struct pc_node {
    pc_node *parent;
    pc_node **children;
    int32_t n_children, cap_children;
    uint32_t *key;              /* len keys */
    int32_t *slots;             /* their KV slots, owned by the cache */
    int32_t len;
    int32_t depth;              /* keys on the path before this node's first */
    uint64_t *blocks;           /* hashes of the blocks ending here (block_count) */
    int32_t refs;               /* locked paths through this node */
    uint64_t last;              /* the cache's clock when last used */
};

struct prefix_cache {
    kv_slots *alloc;            /* borrowed */
    pc_node root;               /* no keys */
    int32_t tokens, locked;
    int32_t locks;              /* matches not unlocked yet (a path each) */
    uint64_t clock;
    int32_t block_size;         /* 0: blocks are not tracked */
    int32_t blocks;
    pc_blocks_removed_fn removed;
    void *removed_ud;
};

/* Blocks ending within keys [depth, depth + len) of a path. */
static int32_t block_count(const prefix_cache *c, int32_t depth, int32_t len)
{
    return c->block_size ? (depth + len) / c->block_size - depth / c->block_size : 0;
}

vlmd_status prefix_cache_create(kv_slots *slots, prefix_cache **out, vlmd_error *err)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for the prefix cache");
    (*out)->alloc = slots;
    return VLMD_OK;
}

void prefix_cache_track_blocks(prefix_cache *c, int32_t block_size, pc_blocks_removed_fn removed,
                               void *ud)
{
    VLMD_ASSERT(c->tokens == 0 && block_size > 0);
    c->block_size = block_size;
    c->removed = removed;
    c->removed_ud = ud;
}

/* Frees n's subtree (and n, unless the root), its slots going back to the
 * allocator when give. */
static void node_free(prefix_cache *c, pc_node *n, bool give)
{
    for (int32_t i = 0; i < n->n_children; i++)
        node_free(c, n->children[i], give);
    if (n->len && give)
        kv_slots_give(c->alloc, n->slots, n->len);
    free(n->children);
    free(n->key);
    free(n->slots);
    free(n->blocks);
    if (n != &c->root)
        free(n);
}

void prefix_cache_free(prefix_cache *c)
{
    if (!c)
        return;
    node_free(c, &c->root, true);
    free(c);
}

void prefix_cache_forget(prefix_cache *c)
{
    node_free(c, &c->root, false);
    c->root = (pc_node){0};
    c->tokens = c->locked = c->locks = c->blocks = 0;
}

static pc_node *find_child(const pc_node *n, uint32_t key)
{
    for (int32_t i = 0; i < n->n_children; i++)
        if (n->children[i]->key[0] == key)
            return n->children[i];
    return NULL;
}

static bool add_child(pc_node *parent, pc_node *child)
{
    if (parent->n_children == parent->cap_children) {
        int32_t cap = parent->cap_children ? 2 * parent->cap_children : 4;
        pc_node **grown = realloc(parent->children, (size_t)cap * sizeof *grown);
        if (!grown)
            return false;
        parent->children = grown;
        parent->cap_children = cap;
    }
    parent->children[parent->n_children++] = child;
    child->parent = parent;
    return true;
}

static void remove_child(pc_node *parent, const pc_node *child)
{
    for (int32_t i = 0; i < parent->n_children; i++)
        if (parent->children[i] == child) {
            parent->children[i] = parent->children[--parent->n_children];
            return;
        }
}

static int32_t common_prefix(const uint32_t *a, int32_t na, const uint32_t *b, int32_t nb)
{
    int32_t k = 0;
    while (k < na && k < nb && a[k] == b[k])
        k++;
    return k;
}

/* Splits x after its first k keys (0 < k < len): a new node takes those,
 * with x's locks and the blocks ending in them, between x and its parent.
 * NULL when out of memory. */
static pc_node *split(prefix_cache *c, pc_node *x, int32_t k)
{
    int32_t nb = block_count(c, x->depth, k);
    pc_node *p = calloc(1, sizeof *p);
    uint32_t *key = p ? malloc((size_t)k * sizeof *key) : NULL;
    int32_t *slots = key ? malloc((size_t)k * sizeof *slots) : NULL;
    pc_node **children = slots ? malloc(4 * sizeof *children) : NULL;
    uint64_t *blocks = children && nb ? malloc((size_t)nb * sizeof *blocks) : NULL;
    if (!children || (nb && !blocks)) {
        free(p), free(key), free(slots), free(children);
        return NULL;
    }
    memcpy(key, x->key, (size_t)k * sizeof *key);
    memcpy(slots, x->slots, (size_t)k * sizeof *slots);
    if (nb) {
        memcpy(blocks, x->blocks, (size_t)nb * sizeof *blocks);
        memmove(x->blocks, x->blocks + nb,
                (size_t)block_count(c, x->depth + k, x->len - k) * sizeof *x->blocks);
    }
    *p = (pc_node){.parent = x->parent, .children = children, .n_children = 1, .cap_children = 4,
                   .key = key, .slots = slots, .len = k, .depth = x->depth, .blocks = blocks,
                   .refs = x->refs, .last = x->last};
    children[0] = x;
    for (int32_t i = 0; i < x->parent->n_children; i++)
        if (x->parent->children[i] == x)
            x->parent->children[i] = p;
    x->parent = p;
    memmove(x->key, x->key + k, (size_t)(x->len - k) * sizeof *x->key);
    memmove(x->slots, x->slots + k, (size_t)(x->len - k) * sizeof *x->slots);
    x->len -= k;
    x->depth += k;
    return p;
}

static void lock_path(prefix_cache *c, pc_node *n, int32_t delta)
{
    for (; n && n != &c->root; n = n->parent) {
        if (n->refs == 0 && delta > 0)
            c->locked += n->len;
        n->refs += delta;
        if (n->refs == 0 && delta < 0)
            c->locked -= n->len;
    }
}

int32_t prefix_cache_match(prefix_cache *c, const uint32_t *key, int32_t n, int32_t *slots_out,
                           pc_node **locked)
{
    pc_node *node = &c->root;
    int32_t i = 0;
    c->clock++;
    while (i < n) {
        pc_node *child = find_child(node, key[i]);
        if (!child)
            break;
        int32_t k = common_prefix(child->key, child->len, key + i, n - i);
        child->last = c->clock;
        if (k < child->len) {
            pc_node *p = split(c, child, k);
            if (p) { /* without memory, the match stops before this node */
                memcpy(slots_out + i, p->slots, (size_t)k * sizeof *slots_out);
                i += k;
                node = p;
            }
            break;
        }
        memcpy(slots_out + i, child->slots, (size_t)k * sizeof *slots_out);
        i += k;
        node = child;
    }
    lock_path(c, node, 1);
    *locked = node == &c->root ? NULL : node;
    c->locks += *locked != NULL;
    return i;
}

void prefix_cache_unlock(prefix_cache *c, pc_node *locked)
{
    lock_path(c, locked, -1);
    c->locks -= locked != NULL;
}

vlmd_status prefix_cache_insert(prefix_cache *c, const uint32_t *key, const int32_t *slots,
                                int32_t n)
{
    VLMD_ASSERT(c->block_size == 0);
    int32_t first_new;
    return prefix_cache_insert_blocks(c, key, slots, n, NULL, &first_new);
}

/* A new leaf under node for key[i..n) with their slots (taken) and the
 * hashes of the blocks ending in them. false when out of memory. */
static bool add_leaf(prefix_cache *c, pc_node *node, const uint32_t *key, const int32_t *slots,
                     int32_t i, int32_t n, const uint64_t *hashes)
{
    int32_t nb = block_count(c, i, n - i);
    pc_node *leaf = calloc(1, sizeof *leaf);
    uint32_t *k = leaf ? malloc((size_t)(n - i) * sizeof *k) : NULL;
    int32_t *s = k ? malloc((size_t)(n - i) * sizeof *s) : NULL;
    uint64_t *b = s && nb ? malloc((size_t)nb * sizeof *b) : NULL;
    if (!s || (nb && !b) || !add_child(node, leaf)) {
        free(leaf), free(k), free(s), free(b);
        return false;
    }
    memcpy(k, key + i, (size_t)(n - i) * sizeof *k);
    memcpy(s, slots + i, (size_t)(n - i) * sizeof *s);
    if (nb)
        memcpy(b, hashes + i / c->block_size, (size_t)nb * sizeof *b);
    leaf->key = k;
    leaf->slots = s;
    leaf->len = n - i;
    leaf->depth = i;
    leaf->blocks = b;
    leaf->last = c->clock;
    c->tokens += n - i;
    c->blocks += nb;
    return true;
}

vlmd_status prefix_cache_insert_blocks(prefix_cache *c, const uint32_t *key, const int32_t *slots,
                                       int32_t n, const uint64_t *hashes, int32_t *first_new)
{
    VLMD_ASSERT(!c->block_size || hashes || n < c->block_size);
    pc_node *node = &c->root;
    int32_t i = 0;
    *first_new = c->block_size ? n / c->block_size : 0;
    c->clock++;
    while (i < n) {
        pc_node *child = find_child(node, key[i]);
        if (!child) {
            if (!add_leaf(c, node, key, slots, i, n, hashes)) {
                kv_slots_give(c->alloc, slots + i, n - i);
                return VLMD_ERR_NOMEM;
            }
            if (c->block_size)
                *first_new = i / c->block_size; /* the blocks ending in the new leaf */
            return VLMD_OK;
        }
        int32_t k = common_prefix(child->key, child->len, key + i, n - i);
        for (int32_t j = 0; j < k; j++) /* held already: a different slot is a duplicate */
            if (child->slots[j] != slots[i + j])
                kv_slots_give(c->alloc, slots + i + j, 1);
        child->last = c->clock;
        i += k;
        if (k < child->len && i < n) {
            pc_node *p = split(c, child, k);
            if (!p) {
                kv_slots_give(c->alloc, slots + i, n - i);
                return VLMD_ERR_NOMEM;
            }
            node = p;
        } else {
            node = child;
        }
    }
    return VLMD_OK;
}

static int by_last(const void *a, const void *b)
{
    uint64_t x = (*(pc_node *const *)a)->last, y = (*(pc_node *const *)b)->last;
    return x < y ? -1 : x > y;
}

/* Appends the unlocked leaves under n to out. */
static void collect_leaves(pc_node *n, pc_node **out, int32_t *count)
{
    for (int32_t i = 0; i < n->n_children; i++) {
        pc_node *ch = n->children[i];
        if (ch->n_children)
            collect_leaves(ch, out, count);
        else if (ch->refs == 0)
            out[(*count)++] = ch;
    }
}

/* Nodes in the tree (the bound of an array of leaves). */
static int32_t count_nodes(const pc_node *n)
{
    int32_t k = n->n_children;
    for (int32_t i = 0; i < n->n_children; i++)
        k += count_nodes(n->children[i]);
    return k;
}

int32_t prefix_cache_evict(prefix_cache *c, int32_t want)
{
    int32_t freed = 0;
    while (freed < want && c->tokens > c->locked) {
        pc_node **leaves = malloc((size_t)(count_nodes(&c->root) + 1) * sizeof *leaves);
        int32_t n = 0;
        if (!leaves)
            break;
        collect_leaves(&c->root, leaves, &n);
        qsort(leaves, (size_t)n, sizeof *leaves, by_last);
        for (int32_t i = 0; i < n && freed < want; i++) {
            pc_node *leaf = leaves[i];
            int32_t nb = block_count(c, leaf->depth, leaf->len);
            kv_slots_give(c->alloc, leaf->slots, leaf->len);
            freed += leaf->len;
            c->tokens -= leaf->len;
            c->blocks -= nb;
            if (nb && c->removed)
                c->removed(leaf->blocks, nb, c->removed_ud);
            remove_child(leaf->parent, leaf);
            free(leaf->children), free(leaf->key), free(leaf->slots), free(leaf->blocks);
            free(leaf);
        }
        free(leaves);
        if (n == 0)
            break; /* (unlocked tokens sit only above locked nodes) */
    }
    return freed;
}

int32_t prefix_cache_tokens(const prefix_cache *c)
{
    return c->tokens;
}

int32_t prefix_cache_evictable(const prefix_cache *c)
{
    return c->tokens - c->locked;
}

int32_t prefix_cache_blocks(const prefix_cache *c)
{
    return c->blocks;
}

int32_t prefix_cache_locks(const prefix_cache *c)
{
    return c->locks;
}

int32_t prefix_cache_path_len(const pc_node *locked)
{
    return locked ? locked->depth + locked->len : 0;
}

bool prefix_cache_path_has_slots(const pc_node *locked, const int32_t *slots)
{
    for (const pc_node *n = locked; n && n->parent; n = n->parent) /* the root has no parent */
        if (memcmp(n->slots, slots + n->depth, (size_t)n->len * sizeof *slots))
            return false;
    return true;
}

static void visit_slots(const pc_node *n, pc_slots_fn fn, void *ud)
{
    if (n->len)
        fn(n->slots, n->len, ud);
    for (int32_t i = 0; i < n->n_children; i++)
        visit_slots(n->children[i], fn, ud);
}

void prefix_cache_visit_slots(const prefix_cache *c, pc_slots_fn fn, void *ud)
{
    visit_slots(&c->root, fn, ud);
}

static void collect_blocks(const prefix_cache *c, const pc_node *n, uint64_t *out, int32_t max,
                           int32_t *count)
{
    int32_t nb = block_count(c, n->depth, n->len);
    for (int32_t i = 0; i < nb && *count < max; i++)
        out[(*count)++] = n->blocks[i];
    for (int32_t i = 0; i < n->n_children; i++)
        collect_blocks(c, n->children[i], out, max, count);
}

int32_t prefix_cache_block_hashes(const prefix_cache *c, uint64_t *out, int32_t max)
{
    int32_t count = 0;
    collect_blocks(c, &c->root, out, max, &count);
    return count;
}
