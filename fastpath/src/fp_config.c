/* fp_config_t's scalar and text settings, generated from FP_CONFIG_SCALARS and FP_CONFIG_TEXTS
 * (fp_server.h): the defaults,
 * and setting or reading a field by name, so that the Cython layer fills the struct from the
 * option table of fastpath/options.py instead of naming each field. */
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "fp_server.h"

/* the largest value of each scalar type FP_CONFIG_SCALARS uses; a new type needs a line here */
#define FP_CONFIG_MAX_int INT_MAX
#define FP_CONFIG_MAX_size_t SIZE_MAX

#define NAME_(type, field, dflt) #field,
const char *const fp_config_fields[FP_CONFIG_N_SCALARS] = {FP_CONFIG_SCALARS(NAME_)};
#undef NAME_
#define NAME_(field, dflt, max) #field,
const char *const fp_config_text_fields[FP_CONFIG_N_TEXTS] = {FP_CONFIG_TEXTS(NAME_)};
#undef NAME_

void fp_config_defaults(fp_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->listen_fd = -1;
    cfg->admin_fd = -1;
    cfg->edge_fd = -1;
    cfg->n_workers = 1;
#define DEFAULT_(type, field, dflt) cfg->field = (dflt);
    FP_CONFIG_SCALARS(DEFAULT_)
#undef DEFAULT_
#define DEFAULT_(field, dflt, max) cfg->field = (dflt), cfg->field##_len = sizeof(dflt) - 1;
    FP_CONFIG_TEXTS(DEFAULT_)
#undef DEFAULT_
}

/* field (field_len bytes) names the scalar field_ */
#define IS_(field_) (field_len == sizeof(#field_) - 1 && memcmp(field, #field_, field_len) == 0)

int fp_config_set(fp_config_t *cfg, const char *field, size_t field_len, long long value)
{
    if (value < 0)
        return -1;
#define SET_(type, field_, dflt)                                                    \
    if (IS_(field_)) {                                                              \
        if ((unsigned long long)value > (unsigned long long)FP_CONFIG_MAX_##type)   \
            return -1;                                                              \
        cfg->field_ = (type)value;                                                  \
        return 0;                                                                   \
    }
    FP_CONFIG_SCALARS(SET_)
#undef SET_
    return -1;
}

int fp_config_get(const fp_config_t *cfg, const char *field, size_t field_len, long long *value)
{
#define GET_(type, field_, dflt)                 \
    if (IS_(field_)) {                           \
        *value = (long long)cfg->field_;         \
        return 0;                                \
    }
    FP_CONFIG_SCALARS(GET_)
#undef GET_
    return -1;
}

int fp_config_set_text(fp_config_t *cfg, const char *field, size_t field_len, const char *value,
                       size_t value_len)
{
#define SET_(field_, dflt, max)                                 \
    if (IS_(field_)) {                                          \
        if (value == NULL || value_len == 0 || value_len > (max)) \
            return -1;                                          \
        cfg->field_ = value;                                    \
        cfg->field_##_len = value_len;                          \
        return 0;                                               \
    }
    FP_CONFIG_TEXTS(SET_)
#undef SET_
    return -1;
}

int fp_config_get_text(const fp_config_t *cfg, const char *field, size_t field_len, const char **value,
                       size_t *value_len)
{
#define GET_(field_, dflt, max)                  \
    if (IS_(field_)) {                           \
        *value = cfg->field_;                    \
        *value_len = cfg->field_##_len;          \
        return 0;                                \
    }
    FP_CONFIG_TEXTS(GET_)
#undef GET_
    return -1;
}
