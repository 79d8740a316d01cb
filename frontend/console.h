/* console.h - GET / (the console's page) and GET /console/<file> (its
 * scripts and styles), from the files embedded in the binary
 * (console_assets.h), when --ui is on.
 *
 * The page carries no data: it is served to anyone, and what it shows comes
 * through the API with the key the user gives it. It is held to a strict
 * Content-Security-Policy (its own scripts and styles only, no inline code,
 * no other origin); hashed assets are cached for good, the page revalidated
 * by its ETag; a client that takes gzip gets it. */
#ifndef VLMD_CONSOLE_H
#define VLMD_CONSOLE_H

typedef struct st_h2o_req_t h2o_req_t;

/* The route handler of "/" and "/console/" (ud unused). */
void console_handle(h2o_req_t *req, void *ud);

#endif
