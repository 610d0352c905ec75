#pragma once
// --set: one "dotted.key=value" applied to the YAML tree of a cluster file,
// before validation, so an override is checked exactly like the file.
#include <yaml-cpp/yaml.h>

#include <string>

namespace pstrain::config_detail {

// Sets the key to the value parsed as YAML (a bare word YAML reserves, such
// as '*', as a string). List entries are numbered from 0 and the index one
// past the end appends. Missing map keys are created, so a misspelt key
// reaches validation and is reported as unknown there. Throws ConfigError
// ("--set 'item': ...") for a malformed item or a path through a value.
void apply_override(YAML::Node& root, const std::string& item);

}  // namespace pstrain::config_detail
