#include "server/ps_role.h"
