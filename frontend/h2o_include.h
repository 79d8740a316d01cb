/* h2o_include.h - includes h2o (built for libuv) without letting its headers'
 * warnings fail our -Werror build; our own code keeps every warning. */
#ifndef VLMD_H2O_INCLUDE_H
#define VLMD_H2O_INCLUDE_H

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wsign-compare"
#include <h2o.h>
#pragma GCC diagnostic pop

#endif
