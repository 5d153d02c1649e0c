// C++: containers and strings on the heap, new/delete through operator new.
#include <algorithm>
#include <iostream>
#include <map>
#include <string>
#include <vector>

int main() {
    std::map<std::string, std::vector<int>> m;
    for (int i = 0; i < 60000; i++) m["key" + std::to_string(i % 997)].push_back(i * 7);
    long long s = 0;
    for (auto &kv : m) {
        std::sort(kv.second.begin(), kv.second.end(), std::greater<int>());
        s += kv.second.front() - kv.second.back() + (long long)kv.first.size();
    }
    auto *big = new std::vector<std::string>(200000, std::string(40, 'x'));
    s += (long long)big->size();
    delete big;
    std::cout << "keys " << m.size() << " sum " << s << std::endl;
}
