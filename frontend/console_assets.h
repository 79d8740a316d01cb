/* console_assets.h - the console's files, embedded at build time
 * (tools/embed_console.c writes the table from console/dist). */
#ifndef VLMD_CONSOLE_ASSETS_H
#define VLMD_CONSOLE_ASSETS_H

#include <stdbool.h>
#include <stddef.h>

typedef struct console_asset {
    const char *path;           /* "/" or "/console/<file>" */
    const char *content_type;
    const unsigned char *data;
    size_t len;
    const unsigned char *gzip;  /* the same bytes gzipped */
    size_t gzip_len;
    const char *etag;           /* quoted: a prefix of the content's SHA-256 */
    bool immutable;             /* its name carries its hash: cached for good */
} console_asset;

extern const console_asset console_assets[];
extern const size_t console_n_assets;
extern const bool console_built;   /* false: npm was missing; "/" says how to get it */

#endif
